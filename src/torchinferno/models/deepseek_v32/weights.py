"""HF name <-> internal name mapping for deepseek-v3.2.

Internal names equal the HF ones except:

* dense MLPs and shared experts merge ``gate_proj``/``up_proj`` into ``gate_up_proj`` (rows
  ``[gate; up]``);
* routed experts live in two 3-D tensors ``mlp.experts.gate_up_proj [E, 2I, D]`` and
  ``mlp.experts.down_proj [E, D, I]``.

Accepted expert layouts: the per-expert hub layout ``mlp.experts.N.{gate,up,down}_proj.weight``
(what the public checkpoints and transformers 5.24's ``save_pretrained`` write) and the fused
3-D layout ``mlp.experts.gate_up_proj`` / ``mlp.experts.down_proj`` (transformers' in-memory
names). ``export_weights`` writes the per-expert layout. Multi-token-prediction layers stored
after the last layer (``model.layers.{L}..``, ``num_nextn_predict_layers``) are skipped.
FP8 block-scaled checkpoints (``X.weight`` in float8 + ``X.weight_scale_inv``, 128x128 blocks) are
dequantized while loading (``checkpoint.fp8``); the pair may arrive in either order.
"""

from __future__ import annotations

import re
from typing import Container, Iterable, Iterator

import torch

from torchinferno.checkpoint.fp8 import Fp8Pairer
from torchinferno.errors import CheckpointError
from torchinferno.models.common.hf_names import missing_hf_names, required_pieces

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_MERGED = {  # HF module suffix -> (internal module suffix, shard)
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.shared_experts.gate_proj": ("mlp.shared_experts.gate_up_proj", 0),
    "mlp.shared_experts.up_proj": ("mlp.shared_experts.gate_up_proj", 1),
}
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")
_FAMILY = "deepseek-v3.2"


def _state(model) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint must fill: parameters + persistent buffers (the router bias)."""
    return {k: v for k, v in model.state_dict(keep_vars=True).items()}


def _target(model, hf_name: str, state: dict) -> tuple[str, object, torch.Tensor | None]:
    """(internal name, piece key, destination view) for one HF tensor; internal '' = skip."""
    cfg = model.config
    m = _LAYER.match(hf_name)
    if m:
        layer, rest = int(m.group(1)), m.group(2)
        if layer >= cfg.num_hidden_layers:
            if layer < cfg.num_hidden_layers + cfg.num_nextn_predict_layers:
                return "", None, None  # MTP module: not part of the causal LM forward
            raise CheckpointError(f"unexpected tensor '{hf_name}' for {_FAMILY}: the config has {cfg.num_hidden_layers} layers")
        prefix = f"model.layers.{layer}."
        e = _EXPERT.match(rest)
        if e:
            expert, proj = int(e.group(1)), e.group(2)
            name = prefix + ("mlp.experts.down_proj" if proj == "down_proj" else "mlp.experts.gate_up_proj")
            if name not in state:
                raise CheckpointError(f"unexpected tensor '{hf_name}' for {_FAMILY}: layer {layer} has no routed experts")
            full = state[name].data
            if expert >= full.shape[0]:
                raise CheckpointError(f"unexpected tensor '{hf_name}': expert {expert} >= n_routed_experts={full.shape[0]}")
            if proj == "down_proj":
                return name, expert, full[expert]
            inter = full.shape[1] // 2
            shard = 0 if proj == "gate_proj" else 1
            return name, (expert, shard), full[expert].narrow(0, shard * inter, inter)
        for hf_mod, (internal, shard) in _MERGED.items():
            if rest == hf_mod + ".weight":
                name = prefix + internal + ".weight"
                if name not in state:
                    break
                full = state[name].data
                inter = full.shape[0] // 2
                return name, shard, full.narrow(0, shard * inter, inter)
    if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
        return "", None, None  # tied: the embedding is the head
    if hf_name not in state:
        raise CheckpointError(f"unexpected tensor '{hf_name}' for {_FAMILY} (no parameter with that name)")
    return hf_name, "__all__", state[hf_name].data


def load_weights(model, tensors: Iterable[tuple[str, torch.Tensor]], only: Container[str] | None = None) -> None:
    """Copy HF-named tensors into ``model`` (materialized, not meta); every tensor must be covered.

    ``only``: the internal tensor names this call fills (one layer of a layer-by-layer load,
    ``kernels.fp8_block_stream``): the rest of the model is neither written nor required, and a tensor
    mapping outside ``only`` is refused as unexpected. A ``meta`` model with ``meta`` tensors checks names and
    shapes without any data."""
    state = _state(model)
    if only is not None:
        state = {k: v for k, v in state.items() if k in only}
    covered: dict[str, set] = {name: set() for name in state}
    for hf_name, tensor in Fp8Pairer(out_dtype=torch.float32)(tensors):
        if _IGNORED.search(hf_name):
            continue
        name, piece, dst = _target(model, hf_name, state)
        if name == "":
            continue
        if tuple(tensor.shape) != tuple(dst.shape):
            raise CheckpointError(
                f"shape mismatch for tensor '{hf_name}': checkpoint {tuple(tensor.shape)}, model expects {tuple(dst.shape)}"
            )
        dst.copy_(tensor.to(dst.dtype))
        covered[name] |= required_pieces(name, state[name]) if piece == "__all__" else {piece}
    missing = [hf for name, got in covered.items() for hf in missing_hf_names(name, required_pieces(name, state[name]) - got)]
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s) for {_FAMILY}, e.g. {', '.join(missing[:5])}")


def export_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) pairs in the per-expert hub layout (what transformers loads)."""
    for name, t in _state(model).items():
        t = t.detach()
        if name.endswith("mlp.experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{base}{e}.gate_proj.weight", t[e, :inter]
                yield f"{base}{e}.up_proj.weight", t[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                yield f"{base}{e}.down_proj.weight", t[e]
        elif name.endswith("gate_up_proj.weight"):
            base, inter = name[: -len("gate_up_proj.weight")], t.shape[0] // 2
            yield f"{base}gate_proj.weight", t[:inter]
            yield f"{base}up_proj.weight", t[inter:]
        else:
            yield name, t
