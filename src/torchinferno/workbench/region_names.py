"""Region names for ``profile-region`` / ``helion-search-region``: the README's short names and module paths.

Accepted (``L`` = number of decoder layers, ``N`` in ``0..L-1``):

* ``forward``                    -- the whole model forward (the root module);
* ``layers.N``                   -- decoder layer N;
* ``layers.N.attn``              -- its attention module (``<stack>.layers.N.self_attn``);
* ``layers.N.mlp``               -- its feed-forward module, dense or MoE (``<stack>.layers.N.mlp``);
* ``layers.N.moe``               -- the same module, which must be a mixture of experts;
* ``attention`` / ``mlp`` / ``moe`` -- the first layer's attention / feed-forward / the first MoE layer;
* any module path of the model (``model.layers.0.self_attn``), as ``named_modules`` spells it.

Invariant: ``resolve_region`` returns ``(module path, module)`` with ``""`` for the root; every
failure is one ``ConfigError`` line that lists the valid names (and close module paths).
"""

from __future__ import annotations

import difflib
import re

from torch import nn

from torchinferno.errors import ConfigError

SHORT_NAMES = ("forward", "attention", "mlp", "moe", "layers.N", "layers.N.attn", "layers.N.mlp", "layers.N.moe")
_LAYER = re.compile(r"^layers\.(\d+)(?:\.(attn|attention|mlp|moe))?$")
_SLOT = {"attn": "self_attn", "attention": "self_attn", "mlp": "mlp", "moe": "mlp"}


def _layer_stack(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """``(path, ModuleList)`` of the decoder layers (the first ``ModuleList`` named ``layers``)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and name.split(".")[-1] == "layers":
            return name, mod
    return None


def is_moe(module: nn.Module) -> bool:
    """A mixture-of-experts block (routed experts), as opposed to a dense MLP."""
    return hasattr(module, "experts")


def moe_layers(model: nn.Module) -> list[int]:
    stack = _layer_stack(model)
    if stack is None:
        return []
    return [i for i, layer in enumerate(stack[1]) if is_moe(getattr(layer, "mlp", nn.Identity()))]


def _valid_hint(model: nn.Module) -> str:
    stack = _layer_stack(model)
    layers = f"N in 0..{len(stack[1]) - 1}" if stack is not None else "no decoder layers found"
    return (f"valid: forward, attention, mlp, moe, layers.N, layers.N.attn, layers.N.mlp, layers.N.moe ({layers}), "
            "or a module path such as model.layers.0.self_attn (`profile-nodes RUN` shows the paths)")


def _layer_slot(model: nn.Module, index: int, slot: str | None, region: str) -> tuple[str, nn.Module]:
    stack = _layer_stack(model)
    if stack is None:
        raise ConfigError(f"region '{region}': this model has no decoder layer list ({_valid_hint(model)})")
    path, layers = stack
    if not 0 <= index < len(layers):
        raise ConfigError(f"region '{region}': layer {index} does not exist (this model has layers 0..{len(layers) - 1})")
    if slot is None:
        return f"{path}.{index}", layers[index]
    attr = _SLOT[slot]
    module = getattr(layers[index], attr, None)
    if module is None:
        raise ConfigError(f"region '{region}': layer {index} has no '{attr}' module")
    if slot == "moe" and not is_moe(module):
        moes = moe_layers(model)
        which = f"MoE layers: {', '.join(map(str, moes))}" if moes else "this model has no MoE layers"
        raise ConfigError(f"region '{region}': layer {index} is a dense MLP, not a mixture of experts ({which})")
    return f"{path}.{index}.{attr}", module


def resolve_region(model: nn.Module, region: str) -> tuple[str, nn.Module]:
    """``(module path, module)`` of ``region`` in ``model`` (see the module docstring for the names)."""
    region = region.strip()
    if region == "forward":
        return "", model
    if region in ("attention", "attn"):
        return _layer_slot(model, 0, "attn", region)
    if region == "mlp":
        return _layer_slot(model, 0, "mlp", region)
    if region == "moe":
        moes = moe_layers(model)
        if not moes:
            raise ConfigError("region 'moe': this model has no MoE layers (every layer is a dense MLP)")
        return _layer_slot(model, moes[0], "moe", region)
    m = _LAYER.match(region)
    if m:
        return _layer_slot(model, int(m.group(1)), m.group(2), region)
    modules = dict(model.named_modules())
    if region and region in modules:
        return region, modules[region]
    names = [n for n in modules if n]
    close = difflib.get_close_matches(region, names, n=3, cutoff=0.5)
    near = f"; close module paths: {', '.join(close)}" if close else ""
    raise ConfigError(f"unknown region '{region}' ({_valid_hint(model)}{near})")
