"""HF name <-> internal name mapping for dsv4 (DeepSeek-V3 spelling of every tensor).

Internal names equal the HF ones except: dense MLPs and shared experts merge ``gate_proj`` /
``up_proj`` into ``gate_up_proj`` (rows ``[gate; up]``), and routed experts live in
``mlp.experts.gate_up_proj [E, 2I, D]`` / ``mlp.experts.down_proj [E, D, I]``. Loading accepts
the per-expert layout ``mlp.experts.N.{gate,up,down}_proj.weight`` and the fused 3-D one;
``export_weights`` writes the per-expert layout. FP8 block-scaled pairs (``X.weight`` +
``X.weight_scale_inv``) are dequantized on the way in.

``refusal_reason(name, config)`` says why a DeepSeek tensor cannot be represented by dsv4 (the
V3.2 indexer, MTP layers, biases), so loaders and ``dsv4-convert`` name it in one line.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch

from torchinferno.checkpoint.fp8 import Fp8Pairer
from torchinferno.errors import CheckpointError
from torchinferno.models.common.hf_names import missing_hf_names, required_pieces

_FAMILY = "dsv4"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")
_REFUSED = (
    (re.compile(r"\.self_attn\.indexer\."), "the DeepSeek-V3.2 sparse-attention indexer has no dsv4 counterpart"),
    (re.compile(r"\.(q_a_proj|kv_a_proj_with_mqa|o_proj)\.bias$"), "attention biases are not part of dsv4"),
    (re.compile(r"^model\.layers\.\d+\.(eh_proj|enorm|hnorm|shared_head)\b"), "multi-token-prediction (MTP) modules are not part of dsv4"),
)


def refusal_reason(name: str, config) -> str | None:
    """Why tensor ``name`` (HF spelling) cannot be represented by a dsv4 model of ``config``, else None."""
    m = _LAYER.match(name)
    if m and int(m.group(1)) >= config.num_hidden_layers:
        return f"layer {m.group(1)} is beyond num_hidden_layers={config.num_hidden_layers} (MTP layers are not part of dsv4)"
    for pattern, why in _REFUSED:
        if pattern.search(name):
            return why
    return None


def _state(model) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint must fill: parameters + persistent buffers (router bias)."""
    return dict(model.state_dict(keep_vars=True))


def hf_views(model) -> dict[str, tuple[str, object, torch.Tensor]]:
    """HF name -> (internal name, piece, destination view), for the per-expert layout and the
    fused 3-D expert names alike. Works on ``meta`` models (views carry the expected shapes)."""
    out: dict[str, tuple[str, object, torch.Tensor]] = {}
    for name, t in _state(model).items():
        t = t.data
        if name.endswith("mlp.experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = (name, (e, 0), t[e, :inter])
                out[f"{base}{e}.up_proj.weight"] = (name, (e, 1), t[e, inter:])
            out[name] = (name, None, t)
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = (name, e, t[e])
            out[name] = (name, None, t)
        elif name.endswith("gate_up_proj.weight"):
            base, inter = name[: -len("gate_up_proj.weight")], t.shape[0] // 2
            out[f"{base}gate_proj.weight"] = (name, 0, t[:inter])
            out[f"{base}up_proj.weight"] = (name, 1, t[inter:])
        else:
            out[name] = (name, None, t)
    return out


def load_weights(model, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into ``model`` (materialized, not meta); every tensor must be covered."""
    state = _state(model)
    views = hf_views(model)
    covered: dict[str, set] = {name: set() for name in state}
    for hf_name, tensor in Fp8Pairer(out_dtype=torch.float32)(tensors):
        if _IGNORED.search(hf_name):
            continue
        if hf_name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if hf_name not in views:
            why = refusal_reason(hf_name, model.config) or "no parameter with that name"
            raise CheckpointError(f"unexpected tensor '{hf_name}' for {_FAMILY}: {why}")
        name, piece, dst = views[hf_name]
        if tuple(tensor.shape) != tuple(dst.shape):
            raise CheckpointError(
                f"shape mismatch for tensor '{hf_name}': checkpoint {tuple(tensor.shape)}, model expects {tuple(dst.shape)}"
            )
        dst.copy_(tensor.to(dst.dtype))
        covered[name] |= required_pieces(name, state[name]) if piece is None else {piece}
    missing = [hf for name, got in covered.items() for hf in missing_hf_names(name, required_pieces(name, state[name]) - got)]
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s) for {_FAMILY}, e.g. {', '.join(missing[:5])}")


def export_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) pairs in the per-expert layout, in module order."""
    views = hf_views(model)
    fused = {n for n, (internal, piece, _) in views.items() if piece is None and n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    for hf_name, (_, _, t) in views.items():
        if hf_name in fused:
            continue
        if hf_name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        yield hf_name, t.detach()
