"""Checkpoint names of deepseek-v4: both spellings in, transformers' in-memory names out.

Internal names are transformers' in-memory ``DeepseekV4ForCausalLM`` names (``model.layers.N.self_attn.q_a_proj``,
``mlp.experts.gate_up_proj [E, 2I, D]`` ...). Loading also accepts the public release / ``save_pretrained`` spelling
(``[model.]layers.N.attn.wq_a``, ``ffn.experts.E.w1/w2/w3``, ``hc_attn_fn``, ``attn_sink``, ``ape``, ``embed``,
``head`` ...), renamed as transformers' conversion mapping does, with per-expert tensors merged; ``mtp.*`` is
ignored. FP8 (e4m3 + 128x128 ue8m0/fp32 block scales) and MXFP4 (packed e2m1 + ue8m0 per 32 values) weights are
dequantized on the way in (``checkpoint/quant_v4.py``). Every error names the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from torchinferno.errors import CheckpointError

_FAMILY = "deepseek-v4"
_IGNORED = re.compile(r"(^|\.)mtp\.|rotary_emb\.|inv_freq$")
# (pattern, replacement) applied in order to a name without its "model." prefix (transformers' order).
_RENAMES = tuple((re.compile(p), r) for p, r in (
    (r"\.attn\.", ".self_attn."), (r"\.ffn\.", ".mlp."), (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight", "embed_tokens.weight"), (r"^head\.weight", "lm_head.weight"),
    (r"^hc_head_fn", "hc_head.hc_fn"), (r"^hc_head_base", "hc_head.hc_base"), (r"^hc_head_scale", "hc_head.hc_scale"),
    (r"\.attn_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_fn", ".attn_hc.fn"), (r"\.hc_attn_base", ".attn_hc.base"), (r"\.hc_attn_scale", ".attn_hc.scale"),
    (r"\.hc_ffn_fn", ".ffn_hc.fn"), (r"\.hc_ffn_base", ".ffn_hc.base"), (r"\.hc_ffn_scale", ".ffn_hc.scale"),
    (r"\.attn_sink", ".sinks"), (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."), (r"\.norm\.", ".kv_norm."), (r"\.ape$", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."), (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."), (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."), (r"\.q_norm\.", ".q_a_norm."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"), (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."), (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
))
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_PIECE = {"w1": ("gate_up_proj", 0), "gate_proj": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1),
          "up_proj": ("gate_up_proj", 1), "w2": ("down_proj", None), "down_proj": ("down_proj", None)}


def canonical_name(name: str) -> str | None:
    """Internal name of a checkpoint tensor in either spelling; None for tensors that are ignored (MTP, rope)."""
    if _IGNORED.search(name):
        return None
    n = name.removeprefix("model.")
    for pattern, repl in _RENAMES:
        n = pattern.sub(repl, n)
    return n if n == "lm_head.weight" else "model." + n


def _target(state: dict[str, torch.Tensor], name: str, hf_name: str) -> tuple[str, object, torch.Tensor]:
    """(internal name, piece, destination view) for a canonical name, expert pieces resolved."""
    if name in state:
        return name, None, state[name].data
    m = _EXPERT.match(name)
    if m:
        kind, half = _PIECE[m.group(3)]
        full = f"{m.group(1)}.{kind}"
        e = int(m.group(2))
        if full in state and e < state[full].shape[0]:
            t = state[full].data[e]
            if half is not None:
                inter = t.shape[0] // 2
                t = t[:inter] if half == 0 else t[inter:]
            return full, (e, half), t
    raise CheckpointError(f"unexpected tensor '{hf_name}' for {_FAMILY}: no parameter with that name")


def _pieces(name: str, t: torch.Tensor) -> set:
    if name.endswith("experts.gate_up_proj"):
        return {(e, h) for e in range(t.shape[0]) for h in (0, 1)}
    if name.endswith("experts.down_proj"):
        return {(e, None) for e in range(t.shape[0])}
    return {None}


def load_weights(model, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy checkpoint tensors (either spelling, FP8/MXFP4 dequantized) into ``model``; every tensor must be covered."""
    from torchinferno.checkpoint.quant_v4 import dequantize_stream

    state = dict(model.state_dict(keep_vars=True))
    covered: dict[str, set] = {n: set() for n in state}
    for hf_name, tensor in dequantize_stream(tensors, out_dtype=torch.float32):
        name = canonical_name(hf_name)
        if name is None:
            continue
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        internal, piece, dst = _target(state, name, hf_name)
        if tuple(tensor.shape) != tuple(dst.shape):
            raise CheckpointError(f"shape mismatch for tensor '{hf_name}': checkpoint {tuple(tensor.shape)}, "
                                  f"model expects {tuple(dst.shape)}")
        if internal.endswith("tid2eid") and tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= model.config.n_routed_experts):
            raise CheckpointError(f"tensor '{hf_name}' routes to expert ids outside [0, {model.config.n_routed_experts})")
        dst.copy_(tensor.to(dst.dtype))
        covered[internal] |= _pieces(internal, state[internal]) if piece is None else {piece}
    missing = [n for n, got in covered.items() if _pieces(n, state[n]) - got]
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s) for {_FAMILY}, e.g. {', '.join(missing[:5])}")


def export_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(internal name, tensor) in module order: transformers' in-memory names, fused 3-D experts."""
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        yield name, t.detach()


def expected_shapes(config) -> dict[str, tuple[int, ...]]:
    """Internal name -> shape of every tensor a checkpoint must provide (built on ``meta``: no memory)."""
    from torchinferno.models.deepseek_v4.model import DeepSeekV4ForCausalLM

    with torch.device("meta"):
        m = DeepSeekV4ForCausalLM(config)
    return {n: tuple(t.shape) for n, t in m.state_dict().items()}
