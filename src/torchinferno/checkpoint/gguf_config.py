"""HF ``config.json`` / ``generation_config.json`` for a llama GGUF, from its metadata.

Invariants: shapes come from the tensors where the metadata could disagree (``vocab_size`` is
the embedding's row count, ``head_dim`` is q rows / heads), so the config always fits the
weights written next to it; a missing required key raises CheckpointError naming it and the
file. Llama-3.1-style rope scaling, which llama.cpp stores as a ``rope_freqs.weight`` tensor
of per-frequency divisors, is turned back into ``rope_scaling = {"rope_type": "llama3", ...}``
and checked by recomputing the tensor.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from torchinferno.errors import CheckpointError

_REQUIRED = ("embedding_length", "feed_forward_length", "block_count", "attention.head_count")


def llama_hf_config(
    meta: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    path: Path,
    rope_freqs: list[float] | None = None,
) -> dict[str, Any]:
    """HF LlamaForCausalLM config for a GGUF with metadata ``meta`` and torch-order ``shapes``."""
    a = "llama."
    for k in _REQUIRED:
        if a + k not in meta:
            raise CheckpointError(f"GGUF file {path} lacks metadata key '{a + k}'")
    if "token_embd.weight" not in shapes:
        raise CheckpointError(f"GGUF file {path} has no tensor 'token_embd.weight'")
    hidden = int(meta[a + "embedding_length"])
    n_head = int(meta[a + "attention.head_count"])
    n_kv = int(meta.get(a + "attention.head_count_kv", n_head))
    q_rows = shapes.get("blk.0.attn_q.weight", (hidden,))[0]
    if q_rows % n_head:
        raise CheckpointError(f"tensor 'blk.0.attn_q.weight' in {path}: {q_rows} rows do not split into {n_head} heads")
    head_dim = q_rows // n_head
    theta = float(meta.get(a + "rope.freq_base", 10000.0))
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(meta[a + "feed_forward_length"]),
        "num_hidden_layers": int(meta[a + "block_count"]),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rms_norm_eps": float(meta.get(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": theta,
        "rope_scaling": rope_scaling(meta, head_dim, theta, path, rope_freqs),
        "max_position_embeddings": int(meta.get(a + "context_length", 2048)),
        "vocab_size": shapes["token_embd.weight"][0],
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "mlp_bias": "blk.0.ffn_up.bias" in shapes,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = meta.get(f"tokenizer.ggml.{key}")
        cfg[key.replace("padding", "pad")] = int(value) if value is not None else None
    return cfg


# a GGUF's recommended sampling (``general.sampling.*``, llama.cpp's writer) -> HF generation_config keys
def _f32(v) -> float:  # GGUF floats are float32: 0.2 is stored as 0.2000000030, written back as 0.2
    return float(f"{float(v):.7g}")


_SAMPLING = (("temp", "temperature", _f32), ("top_k", "top_k", int), ("top_p", "top_p", _f32),
             ("min_p", "min_p", _f32), ("penalty_repeat", "repetition_penalty", _f32))


def generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    """``generation_config.json``: bos/pad ids, every end-of-generation id (eos, eot, eom) and the file's
    recommended sampling when it has one (``general.sampling.*``: the serving defaults, core.generation_defaults)."""
    eos: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        v = meta.get(f"tokenizer.ggml.{key}")
        if v is not None and int(v) not in eos:
            eos.append(int(v))
    out: dict[str, Any] = {"_from_model_config": True}
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        out["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if meta.get("tokenizer.ggml.padding_token_id") is not None:
        out["pad_token_id"] = int(meta["tokenizer.ggml.padding_token_id"])
    for gguf_key, hf_key, cast in _SAMPLING:
        v = meta.get(f"general.sampling.{gguf_key}")
        if v is not None:
            out[hf_key] = cast(v)
    return out


def rope_scaling(
    meta: dict[str, Any], head_dim: int, theta: float, path: Path, rope_freqs: list[float] | None
) -> dict[str, Any] | None:
    """HF ``rope_scaling`` from ``llama.rope.scaling.*`` keys or a ``rope_freqs`` tensor (else None)."""
    kind = meta.get("llama.rope.scaling.type")
    factor = meta.get("llama.rope.scaling.factor")
    orig = meta.get("llama.rope.scaling.original_context_length")
    if rope_freqs is not None:
        return llama3_rope_from_freqs(rope_freqs, head_dim, theta, path, orig)
    if kind in (None, "none") or (factor is not None and float(factor) == 1.0 and kind == "linear"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        if orig is not None:
            out["original_max_position_embeddings"] = int(orig)
        return out
    raise CheckpointError(f"unsupported rope scaling type {kind!r} in GGUF file {path} (supported: linear, yarn)")


def llama3_rope_divisors(head_dim: int, theta: float, factor: float, low: float, high: float, orig: int) -> list[float]:
    """Per-frequency divisors llama.cpp stores in ``rope_freqs.weight`` for llama3 rope scaling."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def llama3_rope_from_freqs(
    divisors: list[float], head_dim: int, theta: float, path: Path, orig: int | None = None
) -> dict[str, Any] | None:
    """Recover llama3 rope parameters (Llama 3.x defaults low=1, high=4) from ``rope_freqs``."""
    if len(divisors) != head_dim // 2:
        raise CheckpointError(
            f"tensor 'rope_freqs.weight' in {path} has {len(divisors)} entries, expected head_dim/2 = {head_dim // 2}"
        )
    factor = max(divisors)
    if factor == 1.0 and min(divisors) == 1.0:
        return None  # all ones: no scaling
    low, high = 1.0, 4.0
    candidates = [int(orig)] if orig else []
    for i, d in enumerate(divisors):  # an entry in the smooth band pins original_max_position_embeddings
        if 1.0 < d < factor:
            s = (1.0 / d - 1.0 / factor) / (1.0 - 1.0 / factor)
            wavelen = 2 * math.pi * theta ** (2 * i / head_dim)
            candidates.append(round(wavelen * (s * (high - low) + low)))
    for o in candidates + [8192]:
        guess = llama3_rope_divisors(head_dim, theta, factor, low, high, o)
        if all(math.isclose(g, d, rel_tol=1e-4) for g, d in zip(guess, divisors)):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": o}
    raise CheckpointError(f"cannot recover llama3 rope scaling from tensor 'rope_freqs.weight' in {path}")
