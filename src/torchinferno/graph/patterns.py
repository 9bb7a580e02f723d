"""Multi-node pattern rewrites on ``make_fx`` ATen graphs, and the named pattern library.

``replace_subgraph_pattern`` is a real subgraph matcher (``torch.fx.subgraph_rewriter``): the
pattern is itself an ATen graph (a callable traced with ``make_fx`` on example inputs of the
target's dtype/rank), matched node-for-node including literals (eps, split sizes, dims), and each
match is swapped for the replacement's nodes (typically one custom op). A match is only taken
when none of its internal values escapes the region except through the pattern's outputs.

Library (``PATTERNS``), each replacing with a ``torch.ops.torchinferno`` op:

* ``fused-rmsnorm-swiglu``: residual add + RMSNorm + merged gate/up projection + SwiGLU
  -> ``fused_rmsnorm_swiglu`` (one match per decoder layer with a dense gated MLP);
* ``swiglu``: ``silu(gate) * up`` over a split of the gate/up projection -> ``swiglu_activation``;
* ``rms-norm``: one RMSNorm (any formulation in ``NORMS``) -> ``rms_norm`` (every norm site of the
  graph whose normalized value does not escape otherwise, e.g. MLA's ``q_a_layernorm``).

Patterns are instantiated from the target graph (``PatternSpec.instantiate(gm)``): the eps
literals and projection sizes are read off the graph, and every RMSNorm formulation the model
code uses (``F.rms_norm`` decomposition, HF-style cast-then-weight, fp32 reference) is tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import fx

from torchinferno.errors import ConfigError
from torchinferno.graph.capture import NODE_ID, trace_with_make_fx

PATTERN_TAG = "ti_pattern"


def replace_subgraph_pattern(gm: fx.GraphModule, pattern: Callable | fx.GraphModule, replacement: Callable | fx.GraphModule,
                             example_inputs: Sequence[torch.Tensor] | None = None, tag: str = "pattern",
                             match_filters: list | None = None) -> list[dict]:
    """Replace every non-overlapping match of ``pattern`` in ``gm`` by ``replacement``.

    ``pattern`` is an ATen ``GraphModule`` or a callable traced with ``make_fx`` on
    ``example_inputs``. ``replacement`` has the same placeholders and outputs (a callable is
    symbolically traced, so it may call ``torch.ops.*`` directly). Returns one record per match:
    ``{"anchor": id, "matched_ids": [...], "replacement_targets": [...]}`` with the original node
    ids of the region removed. New nodes get ``node.meta[PATTERN_TAG] = tag`` and no node id.
    """
    from torch.fx.subgraph_rewriter import replace_pattern_with_filters

    if not isinstance(pattern, fx.GraphModule):
        if example_inputs is None:
            raise ConfigError("a callable pattern needs example_inputs to be traced with make_fx")
        pattern = trace_with_make_fx(pattern, example_inputs)
    # Multi-output ops (native_layer_norm's mean / rstd) leave unused getitems behind: the matcher
    # refuses them in a pattern, and in ``gm`` they would be users outside any match. Dropping
    # them changes no computation (mutating ops are impure and stay) and no other node's id.
    for g in (pattern, gm):
        if g.graph.eliminate_dead_code():
            g.recompile()
    hoist_get_attrs(gm)
    matches = replace_pattern_with_filters(gm, pattern, replacement, match_filters=match_filters)
    out = []
    for m in matches:
        matched = sorted(n.meta[NODE_ID] for p, n in m.nodes_map.items()
                         if p.op not in ("placeholder", "output") and NODE_ID in n.meta)
        for r in m.replacements:
            r.meta[PATTERN_TAG] = tag
        anchor = m.nodes_map.get(m.anchor, m.anchor)
        out.append({"anchor": anchor.meta.get(NODE_ID), "matched_ids": matched,
                    "replacement_targets": [str(r.target) for r in m.replacements if r.op == "call_function"]})
    if out:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return out


def hoist_get_attrs(gm: fx.GraphModule) -> None:
    """Move get_attr nodes (weights: no inputs) right after the placeholders.

    The rewriter inserts a replacement where the matched region starts; a weight fetched later in
    the region (make_fx emits get_attr next to first use) would otherwise be used before it is
    defined. Node ids are unchanged (they live in ``node.meta``).
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    for n in [n for n in gm.graph.nodes if n.op == "get_attr"]:
        if anchor is None:
            first = next(iter(gm.graph.nodes))
            if first is not n:
                first.prepend(n)
        else:
            anchor.append(n)
        anchor = n


# --- RMSNorm formulations found in model code (all on h [T, D], weight [D]) ----------------------

def _norm_functional(h, w, eps):  # kernels.api.rms_norm
    return F.rms_norm(h.float(), (h.shape[-1],), w.float(), eps).to(h.dtype)


def _norm_hf(h, w, eps):  # families' raw_ops: normalize in fp32, cast back, then weight
    hf = h.float()
    return w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def _norm_reference(h, w, eps):  # kernels.reference.ref_rms_norm
    hf = h.float()
    return (w.float() * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps))).to(h.dtype)


def _norm_pair(h, w, eps):  # kernels.api CPU path: LayerNorm of [h, -h] (mean 0, variance mean(h^2))
    d = h.shape[-1]
    out = torch.layer_norm(torch.cat((h, h.neg()), -1), (2 * d,), None, None, eps)[..., :d] * w
    return out if out.dtype == h.dtype else out.to(h.dtype)


NORMS = {"functional": _norm_functional, "hf": _norm_hf, "reference": _norm_reference, "pair": _norm_pair}


@dataclass(frozen=True)
class PatternInstance:
    """One concrete (pattern, replacement, example inputs) triple for ``replace_subgraph_pattern``."""

    label: str
    pattern: Callable
    replacement: Callable
    example_inputs: tuple[torch.Tensor, ...]


def _mlp_sites(gm: fx.GraphModule) -> list[tuple[int, int, torch.dtype]]:
    """(D, I, dtype) of every ``split(mm(x, W^T), I, -1)`` in the graph (merged gate/up projections)."""
    sites = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.split.Tensor and isinstance(n.args[0], fx.Node):
            src = n.args[0]
            val = src.meta.get("val")
            if src.target is torch.ops.aten.mm.default and isinstance(val, torch.Tensor) and isinstance(n.args[1], int):
                inp = src.args[0].meta.get("val")
                if isinstance(inp, torch.Tensor) and val.shape[-1] == 2 * n.args[1]:
                    sites.add((int(inp.shape[-1]), int(n.args[1]), val.dtype))
    return sorted(sites, key=str)


def _eps_literals(gm: fx.GraphModule) -> list[float]:
    """Scalars added to a ``mean``, or given to a LayerNorm (the eps of every RMSNorm in the graph)."""
    adds = (torch.ops.aten.add.Tensor, torch.ops.aten.add.Scalar, torch.ops.aten.add_.Scalar, torch.ops.aten.add_.Tensor)
    eps = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.native_layer_norm.default and len(n.args) == 5:
            eps.add(float(n.args[4]))
        if n.op == "call_function" and n.target in adds and len(n.args) == 2 and isinstance(n.args[1], float):
            if isinstance(n.args[0], fx.Node) and n.args[0].target is torch.ops.aten.mean.dim:
                eps.add(n.args[1])
    return sorted(eps)


def _fused_pair(norm: Callable, eps: float) -> tuple[Callable, Callable]:
    # Closures (not default args): symbolic_trace turns every parameter into a placeholder.
    def pattern(x, residual, w, gu_w):
        h = x + residual
        gate, up = F.linear(norm(h, w, eps), gu_w).chunk(2, dim=-1)
        return F.silu(gate) * up, h

    def replacement(x, residual, w, gu_w):
        out = torch.ops.torchinferno.fused_rmsnorm_swiglu.default(x, residual, w, gu_w, eps)
        return out[0], out[1]

    return pattern, replacement


def _fused_instances(gm: fx.GraphModule) -> list[PatternInstance]:
    out = []
    for d, inter, dtype in _mlp_sites(gm):
        ex = (torch.randn(4, d, dtype=dtype), torch.randn(4, d, dtype=dtype), torch.rand(d, dtype=dtype),
              torch.randn(2 * inter, d, dtype=dtype))
        for eps in _eps_literals(gm):
            for norm_name, norm in NORMS.items():
                pattern, replacement = _fused_pair(norm, eps)
                out.append(PatternInstance(f"{norm_name}/D={d}/I={inter}/eps={eps:g}", pattern, replacement, ex))
    return out


def _half_split_sites(gm: fx.GraphModule) -> list[tuple[int, torch.dtype]]:
    """(I, dtype) of every ``split(t, I, -1)`` of a ``[.., 2I]`` tensor (a gate/up pair, projected or not)."""
    sites = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.split.Tensor and isinstance(n.args[0], fx.Node):
            val = n.args[0].meta.get("val")
            if isinstance(val, torch.Tensor) and isinstance(n.args[1], int) and val.shape[-1] == 2 * n.args[1]:
                sites.add((int(n.args[1]), val.dtype))
    return sorted(sites, key=str)


def _swiglu_instances(gm: fx.GraphModule) -> list[PatternInstance]:
    out = []
    for inter, dtype in _half_split_sites(gm):
        def pattern(gate_up):
            gate, up = gate_up.chunk(2, dim=-1)
            return F.silu(gate) * up

        def replacement(gate_up):
            return torch.ops.torchinferno.swiglu_activation.default(gate_up)

        out.append(PatternInstance(f"I={inter}", pattern, replacement, (torch.randn(4, 2 * inter, dtype=dtype),)))
    return out


def _norm_sites(gm: fx.GraphModule) -> list[tuple[int, int, torch.dtype]]:
    """(D, rank, dtype) of every tensor normalized over its last dim: inputs of ``mean.dim`` (the
    decomposed forms) and of ``native_layer_norm`` (the pair form normalizes ``[h, -h]``: D = n / 2)."""
    sites = set()
    float_dtypes = {v.dtype for n in gm.graph.nodes for v in [n.meta.get("val")]
                    if n.op in ("placeholder", "get_attr") and isinstance(v, torch.Tensor) and v.is_floating_point()}
    for n in gm.graph.nodes:
        if n.op != "call_function" or not n.args or not isinstance(n.args[0], fx.Node):
            continue
        val = n.args[0].meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() < 1:
            continue
        if n.target is torch.ops.aten.mean.dim:
            dims = {int(val.shape[-1])}
        elif n.target is torch.ops.aten.native_layer_norm.default and len(n.args[1]) == 1:
            dims = {int(n.args[1][0]), *([int(n.args[1][0]) // 2] if n.args[1][0] % 2 == 0 else [])}
        else:
            continue
        for d in dims:
            for dtype in float_dtypes | {val.dtype}:
                sites.add((d, val.dim(), dtype))
    return sorted(sites, key=str)


def _norm_pair_fns(norm: Callable, eps: float) -> tuple[Callable, Callable]:
    def pattern(h, w):
        return norm(h, w, eps)

    def replacement(h, w):
        return torch.ops.torchinferno.rms_norm.default(h, w, eps)

    return pattern, replacement


def _rms_instances(gm: fx.GraphModule) -> list[PatternInstance]:
    out = []
    for d, rank, dtype in _norm_sites(gm):
        ex = (torch.randn(*([2] * (rank - 1)), d, dtype=dtype), torch.rand(d, dtype=dtype))
        for eps in _eps_literals(gm):
            for norm_name, norm in NORMS.items():
                pattern, replacement = _norm_pair_fns(norm, eps)
                out.append(PatternInstance(f"{norm_name}/D={d}/rank={rank}/{dtype}/eps={eps:g}", pattern, replacement, ex))
    return out


@dataclass(frozen=True)
class PatternSpec:
    name: str
    description: str
    instantiate: Callable[[fx.GraphModule], list[PatternInstance]]
    replacement_op: str


PATTERNS: dict[str, PatternSpec] = {
    "fused-rmsnorm-swiglu": PatternSpec(
        "fused-rmsnorm-swiglu", "residual add + RMSNorm + gate/up projection + SwiGLU -> one custom op",
        _fused_instances, "torchinferno.fused_rmsnorm_swiglu"),
    "swiglu": PatternSpec("swiglu", "silu(gate) * up -> one custom op", _swiglu_instances, "torchinferno.swiglu_activation"),
    "rms-norm": PatternSpec("rms-norm", "one RMSNorm (any formulation the families use) -> one custom op", _rms_instances,
                            "torchinferno.rms_norm"),
}


def get_pattern(name: str) -> PatternSpec:
    if name not in PATTERNS:
        raise ConfigError(f"unknown pattern '{name}' (valid: {', '.join(sorted(PATTERNS))})")
    return PATTERNS[name]


def apply_pattern(gm: fx.GraphModule, name: str) -> dict[str, Any]:
    """Apply the named library pattern to ``gm`` in place; returns ``{"pattern", "replaced", "matches"}``."""
    import torchinferno.kernels.custom_ops  # noqa: F401  (registers torch.ops.torchinferno.*)

    spec = get_pattern(name)
    matches: list[dict] = []
    for inst in spec.instantiate(gm):
        for m in replace_subgraph_pattern(gm, inst.pattern, inst.replacement, inst.example_inputs, tag=name):
            matches.append({**m, "variant": inst.label})
    return {"pattern": name, "replaced": len(matches), "replacement_op": spec.replacement_op, "matches": matches}
