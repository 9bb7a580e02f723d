"""A checkpoint's own FP8 blocks (``X.weight`` e4m3 + ``X.weight_scale_inv``), kept for ``--quantization fp8-block``.

The load path itself is unchanged: ``load_weights`` streams the checkpoint into the model, dequantizing FP8 pairs
(``checkpoint.fp8``), so every check of a load still applies. :func:`checkpoint_blocks` then reads, from the
same files, the raw pairs of exactly the modules ``kernels.fp8_block_model.quantize_model_fp8_block`` swaps, keyed by
internal module name, and the swap uses them as they are: the weights multiplied are the checkpoint's bits, not a
re-quantization of their bf16 dequantization. Peak host memory: the loaded model plus the kept FP8 bytes.
``kernels.fp8_block_stream`` (the layer-by-layer build) uses :class:`BlockPlan` directly: it keeps each layer's raw
pairs as that layer's tensors stream past (each tensor read once).

Name mapping (DeepSeek-V3 / V3.2 hub layout, ``models.deepseek_v32.weights``):

* ``P.weight`` -> the exact ``nn.Linear`` ``P`` (not the logits head);
* ``X.gate_proj.weight`` + ``X.up_proj.weight`` -> the merged ``X.gate_up_proj`` (rows and scale rows
  concatenated: needs the gate rows to be a multiple of 128, else ConfigError);
* ``X.experts.E.{gate,up,down}_proj.weight`` -> ``X.experts`` (a ``RoutedExperts``), stacked per expert.

Pairs whose module is not swapped (MLA's ``kv_b_proj``, read as a weight; anything unmapped) stay dequantized.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from torchinferno.checkpoint.fp8 import SCALE_SUFFIX
from torchinferno.errors import ConfigError
from torchinferno.kernels.fp8_block import GROUP

_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_HALF = re.compile(r"^(.*)\.(gate_proj|up_proj)\.weight$")


def _targets(model: nn.Module, skip: tuple[str, ...]) -> tuple[set[str], dict[str, int]]:
    """(names of the exact nn.Linears a swap replaces, RoutedExperts name -> expert count)."""
    from torchinferno.models.common.layers import RoutedExperts

    linears, experts = set(), {}
    for name, m in model.named_modules():
        if type(m) is nn.Linear and not name.endswith(skip):
            linears.add(name)
        elif type(m) is RoutedExperts:
            experts[name] = m.gate_up_proj.shape[0]
    return linears, experts


def checkpoint_blocks(model: nn.Module, ckpt_dir: str | Path, skip: tuple[str, ...] = ("lm_head",),
                      ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, tuple[torch.Tensor, ...]]]:
    """(linears: module name -> (weight e4m3 [N, K], scale_inv [N/128, K/128]), experts: module name ->
    (gate_up [E, 2I, D], gate_up_s, down [E, D, I], down_s)) from ``ckpt_dir``'s e4m3 block pairs (CPU tensors).
    Empty dicts for a checkpoint without FP8 pairs. An expert set is kept only when every expert's three
    projections are FP8 pairs."""
    from torchinferno.checkpoint.safetensors_io import iter_tensors, tensor_index

    plan = BlockPlan.of(model, tensor_index(ckpt_dir), skip)
    names = plan.tensor_names()
    raw = dict(iter_tensors(ckpt_dir, names)) if names else {}
    return plan.assemble(raw)


class BlockPlan:
    """Which checkpoint tensors are the FP8 pairs of the modules a block-FP8 swap replaces (module docstring's
    mapping), decided from a safetensors index and the model's modules (a ``meta`` model will do) before any read.

    ``wanted``: HF weight name -> ``("linear", module)`` / ``("half", (gate_up module, "gate_proj"|"up_proj"))`` /
    ``("expert", (experts module, expert, projection))``; ``experts``: RoutedExperts name -> expert count."""

    def __init__(self, wanted: dict[str, tuple[str, object]], experts: dict[str, int]):
        self.wanted = wanted
        self.experts = experts

    @classmethod
    def of(cls, model: nn.Module, index: dict, skip: tuple[str, ...] = ("lm_head",)) -> "BlockPlan":
        """``index``: HF name -> ``safetensors_io.TensorInfo`` (only ``torch_dtype`` is read)."""
        linears, expert_mods = _targets(model, skip)
        wanted: dict[str, tuple[str, object]] = {}
        for sname in index:
            if not sname.endswith(SCALE_SUFFIX):
                continue
            base = sname[: -len(SCALE_SUFFIX)]
            if base not in index or index[base].torch_dtype != torch.float8_e4m3fn:
                continue
            mod = base.removesuffix(".weight")
            if mod in linears:
                wanted[base] = ("linear", mod)
            elif (m := _EXPERT.match(base)) and m.group(1) in expert_mods:
                wanted[base] = ("expert", (m.group(1), int(m.group(2)), m.group(3)))
            elif (m := _HALF.match(base)) and f"{m.group(1)}.gate_up_proj" in linears:
                wanted[base] = ("half", (f"{m.group(1)}.gate_up_proj", m.group(2)))
        return cls(wanted, expert_mods)

    def tensor_names(self, among: set[str] | None = None) -> list[str]:
        """The HF names to keep raw (each weight and its scale), restricted to ``among`` when given."""
        return [n for base in self.wanted if among is None or base in among for n in (base, base + SCALE_SUFFIX)]

    def module_of(self, base: str) -> str:
        """The module a wanted HF weight name's pair goes to."""
        kind, key = self.wanted[base]
        return key if kind == "linear" else key[0]

    def complete(self, bases: set[str]) -> dict[str, tuple[str, ...]]:
        """The modules :meth:`assemble` keeps when given the pairs of ``bases`` (wanted HF weight names) -> the
        internal names of the float tensors their FP8 blocks replace (``X.weight``; experts' two 3-D tensors)."""
        need: dict[str, int] = {}
        got: dict[str, int] = {}
        for base in bases:
            kind, _ = self.wanted[base]
            mod = self.module_of(base)
            need[mod] = 3 * self.experts[mod] if kind == "expert" else 2 if kind == "half" else 1
            got[mod] = got.get(mod, 0) + 1
        return {mod: (f"{mod}.gate_up_proj", f"{mod}.down_proj") if mod in self.experts else (f"{mod}.weight",)
                for mod, n in got.items() if n == need[mod]}

    def assemble(self, raw: dict[str, torch.Tensor],
                 ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, tuple[torch.Tensor, ...]]]:
        """(linears, experts) as :func:`checkpoint_blocks` returns them, from the raw pairs in ``raw`` (HF name ->
        tensor; popped as used): only modules whose every pair is in ``raw`` (a gate_up needs both halves, an expert
        set all its experts' three projections)."""
        kept_lin: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        halves: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        per_expert: dict[str, dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]] = {}
        for base, (kind, key) in self.wanted.items():
            if base not in raw or base + SCALE_SUFFIX not in raw:
                continue
            pair = (raw.pop(base), raw.pop(base + SCALE_SUFFIX).float())
            if kind == "linear":
                kept_lin[key] = pair
            elif kind == "half":
                halves.setdefault(key[0], {})[key[1]] = pair
            else:
                per_expert.setdefault(key[0], {})[key[1:]] = pair
        for mod, parts in halves.items():
            if len(parts) == 2:
                kept_lin[mod] = _merge_halves(mod, parts["gate_proj"], parts["up_proj"])
        kept_exp = {}
        for mod, parts in per_expert.items():
            E = self.experts[mod]
            if len(parts) == 3 * E:
                gate_up = [_merge_halves(f"{mod}.{e}", parts[(e, "gate_proj")], parts[(e, "up_proj")])
                           for e in range(E)]
                down = [parts[(e, "down_proj")] for e in range(E)]
                kept_exp[mod] = (torch.stack([w for w, _ in gate_up]), torch.stack([s for _, s in gate_up]),
                                 torch.stack([w for w, _ in down]), torch.stack([s for _, s in down]))
        return kept_lin, kept_exp


def _merge_halves(mod: str, gate: tuple[torch.Tensor, torch.Tensor], up: tuple[torch.Tensor, torch.Tensor],
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate and up pairs -> the merged ``[gate; up]`` weight and scales (their 128-row blocks stacked)."""
    (wg, sg), (wu, su) = gate, up
    if wg.shape[0] % GROUP:
        raise ConfigError(f"--quantization fp8-block: '{mod}' has gate/up projections of {wg.shape[0]} rows, not a "
                          f"multiple of {GROUP}, so their FP8 blocks cannot be merged into gate_up_proj; valid here: "
                          "--quantization none, fp8")
    return torch.cat([wg, wu]), torch.cat([sg, su])
