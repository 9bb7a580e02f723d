"""Convert a llama-architecture GGUF file into a Hugging Face checkpoint directory.

``convert_gguf(gguf_path, out_dir)`` writes ``config.json``, ``generation_config.json``,
safetensors weights (via :func:`save_hf_dir`), ``tokenizer.json`` and ``tokenizer_config.json``.

Invariants:

* Every tensor is dequantized (any type ``gguf.quants.dequantize`` knows: F32/F16/BF16, Q4_0..Q8_0,
  K-quants, ...) to float32 and then cast to ``dtype``; nothing stays quantized.
* llama.cpp stores ``attn_q``/``attn_k`` rows interleaved per head for its rope layout
  (HF rows ``[h, 2, d/2]`` become ``[h, d/2, 2]``); this is undone with ``n_head`` for q and
  ``n_head_kv`` for k, so the output matches the HF checkpoint the GGUF was made from.
* The tensor set and every shape are checked against the config before anything is written;
  an unknown, missing or misshapen tensor raises CheckpointError naming it and the file.
* Tensors are dequantized one at a time and streamed into the shard writer.
* The 2-D weights stored in a block format our quantized CPU GEMV reads (Q8_0, Q4_0, Q4_1) are also
  kept as the file's raw blocks (q/k rows un-permuted the same way: a row's blocks move with it) in
  ``gguf_blocks.safetensors`` under their HF names, metadata ``formats`` = {name: format}: what
  ``--quantization gguf`` / ``--dtype auto`` multiply natively (``kernels/cpu_quant_linear.py``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from torchinferno.checkpoint.gguf_config import generation_config, llama_hf_config
from torchinferno.checkpoint.gguf_meta import gguf_metadata, open_gguf
from torchinferno.checkpoint.gguf_tokenizer import write_tokenizer_files
from torchinferno.checkpoint.safetensors_io import save_hf_dir, write_json
from torchinferno.errors import CheckpointError

SUPPORTED_ARCHITECTURES = ("llama",)

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCKS_FILE = "gguf_blocks.safetensors"  # = kernels.cpu_quant_linear.BLOCKS_FILE (kept import-light here)
_SKIPPED = {"rope_freqs.weight"}  # folded into config.rope_scaling
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """HF Llama parameter name for a GGUF tensor name (None if it is not a llama tensor)."""
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    m = _GLOBAL_RE.match(gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    return None


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's q/k row permutation: rows ``[h, d/2, 2]`` -> ``[h, 2, d/2]``."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def convert_gguf(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    *,
    progress: bool = False,
    max_shard_bytes: int = 2 * 1024**3,
) -> Path:
    """Convert ``gguf_path`` into an HF-layout directory ``out_dir`` (created); returns it.

    Only ``general.architecture == "llama"`` is supported; anything else raises
    CheckpointError before anything is written. ``progress`` shows a tqdm bar over tensors.
    """
    path = Path(gguf_path)
    reader = open_gguf(path)
    meta = gguf_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"unsupported GGUF architecture '{arch}' in {path} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    by_name = {t.name: t for t in reader.tensors}
    shapes = {name: _torch_shape(t) for name, t in by_name.items()}
    rope_freqs = _read_rope_freqs(by_name.get("rope_freqs.weight"), path)
    config = llama_hf_config(meta, shapes, dtype, path, rope_freqs=rope_freqs)
    _check_tensors(shapes, config, path)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    blocks: dict[str, tuple[str, torch.Tensor]] = {}
    tensors = _converted_tensors(reader.tensors, config, dtype, path, progress, blocks)
    save_hf_dir(out, config, tensors, max_shard_bytes=max_shard_bytes,
                metadata={"source": "gguf", "gguf_file": path.name})
    if blocks:
        from safetensors.torch import save_file

        formats = json.dumps({name: fmt for name, (fmt, _) in blocks.items()})
        save_file({name: raw for name, (_, raw) in blocks.items()}, str(out / BLOCKS_FILE),
                  metadata={"formats": formats, "gguf_file": path.name})
    write_json(out / "generation_config.json", generation_config(meta))
    write_tokenizer_files(meta, out, path)
    return out


def _torch_shape(t: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(list(t.shape)))  # GGUF lists dims fastest-first


def _read_rope_freqs(t: Any, path: Path) -> list[float] | None:
    if t is None:
        return None
    return [float(v) for v in _dequantize(t, path).reshape(-1).tolist()]


def _expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"token_embd.weight": (cfg["vocab_size"], h), "output_norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        out["output.weight"] = (cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        b = f"blk.{i}."
        out.update({
            b + "attn_norm.weight": (h,), b + "ffn_norm.weight": (h,),
            b + "attn_q.weight": (q, h), b + "attn_k.weight": (kv, h), b + "attn_v.weight": (kv, h),
            b + "attn_output.weight": (h, q),
            b + "ffn_gate.weight": (inter, h), b + "ffn_up.weight": (inter, h), b + "ffn_down.weight": (h, inter),
        })
        if cfg["attention_bias"]:
            out.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if cfg["mlp_bias"]:
            out.update({b + "ffn_gate.bias": (inter,), b + "ffn_up.bias": (inter,), b + "ffn_down.bias": (h,)})
    return out


def _check_tensors(shapes: dict[str, tuple[int, ...]], cfg: dict[str, Any], path: Path) -> None:
    expected = _expected_shapes(cfg)
    for name, shape in shapes.items():
        if name in _SKIPPED:
            continue
        if name not in expected:
            raise CheckpointError(f"unexpected tensor '{name}' in llama GGUF file {path}")
        if shape != expected[name]:
            raise CheckpointError(
                f"tensor '{name}' in {path} has shape {list(shape)}, expected {list(expected[name])} from the metadata"
            )
    for name in expected:
        if name not in shapes:
            raise CheckpointError(f"GGUF file {path} lacks tensor '{name}'")


def _dequantize(t: Any, path: Path) -> Any:
    import numpy as np
    from gguf.quants import dequantize

    try:
        arr = dequantize(np.asarray(t.data), t.tensor_type)
        arr = np.asarray(arr, dtype=np.float32).reshape(_torch_shape(t))
    except NotImplementedError:
        raise CheckpointError(
            f"tensor '{t.name}' in {path} uses type {t.tensor_type.name}, which cannot be dequantized"
        ) from None
    except ValueError as e:
        raise CheckpointError(f"tensor '{t.name}' in {path} is corrupt: {e}") from None
    return arr if arr.flags.writeable else arr.copy()


def _raw_blocks(t: Any) -> tuple[str, torch.Tensor] | None:
    """(format, raw uint8 [rows, row bytes]) of a 2-D tensor in a format the quantized GEMV reads, else None."""
    import numpy as np

    from torchinferno.kernels.cpu_qgemv import BY_GGML_TYPE

    f = BY_GGML_TYPE.get(int(t.tensor_type))
    if f is None or len(t.shape) != 2:
        return None
    rows = int(t.shape[1])
    return f.name, torch.from_numpy(np.array(t.data, copy=True)).view(torch.uint8).reshape(rows, -1)


def _converted_tensors(
    gguf_tensors: list[Any], cfg: dict[str, Any], dtype: torch.dtype, path: Path, progress: bool,
    blocks: dict[str, tuple[str, torch.Tensor]] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, dequantized tensor) per GGUF tensor; ``blocks`` (when given) also gets the raw blocks kept."""
    from tqdm.auto import tqdm

    bar = tqdm(gguf_tensors, desc=f"convert {path.name}", unit="tensor", disable=not progress)
    for t in bar:
        if t.name in _SKIPPED:
            continue
        w = torch.from_numpy(_dequantize(t, path))
        raw = _raw_blocks(t) if blocks is not None else None
        heads = {".attn_q.": cfg["num_attention_heads"], ".attn_k.": cfg["num_key_value_heads"]}
        for key, n in heads.items():
            if key in t.name:
                w = unpermute_rope_rows(w, n)
                raw = None if raw is None else (raw[0], unpermute_rope_rows(raw[1], n))
        if raw is not None:
            blocks[hf_name(t.name)] = raw  # type: ignore[index]  # names were checked
        yield hf_name(t.name), w.to(dtype)  # type: ignore[misc]  # names were checked
