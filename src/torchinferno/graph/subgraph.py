"""Cut a node-id slice out of a captured graph into a standalone callable graph.

Invariants of ``extract_subgraph(gm, ids)``:

* the subgraph contains exactly the selected call nodes, in their original order, with their
  original ids in ``node.meta``;
* every value a selected node reads from outside the slice becomes a placeholder (a *boundary
  input*), except weights/constants (get_attr), which are copied into the subgraph's root;
* its outputs are the selected nodes whose value is read outside the slice (by a later node or
  the graph output); if none is, the last selected node;
* ``capture_boundary_values`` runs the full graph once and snapshots each boundary input right
  before its first selected consumer runs and each output when the selected run that produced
  it ends, so ``subgraph(*inputs)`` must reproduce ``expected`` exactly (up to kernel
  determinism; a non-contiguous selection whose later part mutates an earlier output in place
  is the one case where the two can differ, and the comparison then shows it);
* uninitialized allocations (``aten.empty*``) are zero-filled both in the subgraph and while
  capturing, so a buffer the slice only partly writes (an attention output filled row range by
  row range) compares deterministically instead of exposing garbage memory.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch
from torch import fx

from torchinferno.errors import ConfigError
from torchinferno.graph.capture import NODE_ID, PARAM_NAME, module_path, nodes_by_id, target_name


def _zeros_for_empty() -> dict:
    aten = torch.ops.aten
    return {aten.empty.memory_format: aten.zeros.default, aten.empty_like.default: aten.zeros_like.default,
            aten.new_empty.default: aten.new_zeros.default}


def zeroed_call(target, kwargs: dict):
    """(target, kwargs) with an ``empty`` allocation swapped for its ``zeros`` twin (else unchanged)."""
    table = _zeros_for_empty()
    if target not in table:
        return target, kwargs
    if target is torch.ops.aten.empty.memory_format:
        kwargs = {k: v for k, v in kwargs.items() if k != "memory_format"}
    return table[target], kwargs


def parse_node_selection(spec: str | Sequence[str], num_nodes: int) -> list[int]:
    """``"42:50"`` (inclusive), ``"42,43"``, ``"42 43"`` or a list of those -> sorted unique ids.

    Raises a one-line ``ConfigError`` naming the valid range for ids outside ``0..num_nodes-1``.
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    tokens = [t for p in parts for t in re.split(r"[,\s]+", str(p).strip()) if t]
    if not tokens:
        raise ConfigError(f"no node ids given (valid: 0..{num_nodes - 1}, e.g. --nodes 10:20)")
    ids: set[int] = set()
    for tok in tokens:
        m = re.fullmatch(r"(\d+)(?::(\d+))?", tok)
        if not m:
            raise ConfigError(f"cannot parse node selection '{tok}' (use 42:50, 42,43 or 42 43; valid ids: 0..{num_nodes - 1})")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ConfigError(f"empty node range '{tok}' (the end must be >= the start; valid ids: 0..{num_nodes - 1})")
        bad = [i for i in (lo, hi) if i >= num_nodes]
        if bad:
            raise ConfigError(f"node id {bad[0]} is out of range (valid: 0..{num_nodes - 1})")
        ids.update(range(lo, hi + 1))
    return sorted(ids)


@dataclass
class SubgraphSpec:
    """Plain-data description written as ``subgraph_spec.json``."""

    nodes: list[dict]
    boundary_inputs: list[dict]
    outputs: list[dict]
    constants: list[dict]
    skipped: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _describe(node: fx.Node) -> dict:
    val = node.meta.get("val")
    d = {"id": node.meta.get(NODE_ID), "name": node.name, "op": node.op, "target": target_name(node), "module": module_path(node)}
    if isinstance(val, torch.Tensor):
        d.update(shape=list(val.shape), dtype=str(val.dtype))
    elif isinstance(val, (list, tuple)):
        d.update(shape=[list(v.shape) for v in val if isinstance(v, torch.Tensor)], dtype="tuple")
    return d


def extract_subgraph(gm: fx.GraphModule, ids: Sequence[int]) -> tuple[fx.GraphModule, SubgraphSpec]:
    """Build the standalone subgraph of nodes ``ids`` (see module docstring for the invariants)."""
    by_id = nodes_by_id(gm)
    chosen, skipped = [], []
    for i in sorted(set(ids)):
        if i not in by_id:
            raise ConfigError(f"node id {i} is not in the graph (valid: 0..{len(by_id) - 1})")
        n = by_id[i]
        (skipped if n.op in ("placeholder", "output", "get_attr") else chosen).append(n)
    if not chosen:
        raise ConfigError("the selection has no compute nodes (only inputs, weights or the output); widen --nodes")
    selected = set(chosen)
    g = fx.Graph()
    root = torch.nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    inputs, constants = [], []

    def bring(n: fx.Node) -> fx.Node:
        if n in env:
            return env[n]
        if n.op == "get_attr":
            name = re.sub(r"\W", "_", str(n.target))
            root.register_buffer(name, _fetch_attr(gm, n.target))
            env[n] = g.get_attr(name)
            constants.append({**_describe(n), "attr": name, "param": n.meta.get(PARAM_NAME)})
        else:
            env[n] = g.placeholder(f"in_{n.name}")
            inputs.append(_describe(n))
        env[n].meta.update(n.meta)
        return env[n]

    # Boundary placeholders first (FX convention: the signature lists them in first-use order).
    for n in chosen:
        for inp in n.all_input_nodes:
            if inp not in selected and inp.op != "get_attr":
                bring(inp)
    for n in chosen:
        for inp in n.all_input_nodes:
            if inp not in selected:
                bring(inp)
        env[n] = g.node_copy(n, lambda a: env[a])
        env[n].meta.update(n.meta)
        if n.op == "call_function":
            env[n].target, env[n].kwargs = zeroed_call(n.target, dict(n.kwargs))
    outs = [n for n in chosen if any(u not in selected for u in n.users)] or [chosen[-1]]
    g.output(tuple(env[n] for n in outs))
    sub = fx.GraphModule(root, g)
    spec = SubgraphSpec(nodes=[_describe(n) for n in chosen], boundary_inputs=inputs,
                        outputs=[_describe(n) for n in outs], constants=constants, skipped=[_describe(n) for n in skipped])
    return sub, spec


def _fetch_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in str(target).split("."):
        obj = getattr(obj, part)
    return obj


def snapshot(v: Any) -> Any:
    """Detached clone of a tensor / nested list of tensors (other values returned as they are)."""
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, (list, tuple)):
        return type(v)(snapshot(x) for x in v)
    return v


def capture_boundary_values(gm: fx.GraphModule, args: Sequence[Any], spec: SubgraphSpec) -> tuple[list, list]:
    """Run ``gm(*args)``; return (boundary input values, expected output values) in spec order.

    Inputs are snapshotted right before their first selected consumer runs. An output is
    snapshotted once the selected run that produced it ends (before the next non-selected call
    node, which may write into it through a view) or after the last selected node.
    """
    by_id = nodes_by_id(gm)
    in_nodes = [by_id[d["id"]] for d in spec.boundary_inputs]
    out_nodes = [by_id[d["id"]] for d in spec.outputs]
    selected = {by_id[d["id"]] for d in spec.nodes}
    last = max(selected, key=lambda n: n.meta[NODE_ID])
    got_in: dict[fx.Node, Any] = {}
    got_out: dict[fx.Node, Any] = {}
    pending: list[fx.Node] = []

    class _Capture(fx.Interpreter):
        def call_function(self, target, args, kwargs):
            target, kwargs = zeroed_call(target, dict(kwargs))
            return super().call_function(target, args, kwargs)

        def _flush(self) -> None:
            for o in pending:
                got_out[o] = snapshot(self.env[o])
            pending.clear()

        def run_node(self, n: fx.Node):
            if n in selected:
                for inp in n.all_input_nodes:
                    if inp in in_nodes and inp not in got_in:
                        got_in[inp] = snapshot(self.env[inp])
            elif n.op.startswith("call_") and pending:
                self._flush()
            result = super().run_node(n)
            if n in out_nodes:
                self.env[n] = result
                pending.append(n)
            if n is last:
                self._flush()
            return result

    with torch.no_grad():
        _Capture(gm, garbage_collect_values=False).run(*args)
    return [got_in[n] for n in in_nodes], [got_out[n] for n in out_nodes]


def _flat(v: Any) -> list:
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _flat(item)]
    return [v]


def max_abs_diff(actual: Sequence[Any], expected: Sequence[Any]) -> float:
    """Largest |a - e| over all tensors (inf on a shape/dtype-kind mismatch; non-tensors must be equal)."""
    worst = 0.0
    for a, e in zip(_flat(list(actual)), _flat(list(expected)), strict=True):
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor):
            if a.shape != e.shape:
                return float("inf")
            if a.numel():
                worst = max(worst, float((a.double() - e.double()).abs().max()))
        elif a != e:
            return float("inf")
    return worst
