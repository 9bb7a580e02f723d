"""FX windows: the small connected pieces of a captured graph a kernel template can replace.

A *window* is one site of a graph-library pattern (``graph.patterns``) in a graph: the original
node ids of the nodes the pattern would replace. Its size is the number of compute nodes in it
(``call_function`` nodes other than ``operator.getitem``, which only unpacks a tuple).
``find_windows`` applies each pattern to a copy of the graph (the graph itself is never
changed), keeps the sites inside ``within`` (e.g. a region's node ids) and splits them into
windows of at most ``max_nodes`` compute nodes and ones that are too large.

``window_case`` turns a window into something a provider can be measured on: the standalone
subgraph (``graph.subgraph.extract_subgraph``) on ``device`` with seeded random boundary inputs
of the recorded shapes/dtypes. Constants traced on ``meta`` (shape-only discovery traces) are
materialized the same way; allocations the graph spells with a device follow ``device``.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import torch
from torch import fx

from torchinferno.errors import ConfigError
from torchinferno.graph.capture import module_path, nodes_by_id, target_name


@dataclass
class Window:
    pattern: str
    node_ids: list[int]
    compute_nodes: int
    targets: list[str]
    module: str  # longest module path shared by the window's nodes ("" = the root)
    variant: str  # which pattern instance matched (formulation / sizes / eps)

    def to_dict(self) -> dict:
        return asdict(self)


def compute_node_count(nodes: Iterable[fx.Node]) -> int:
    return sum(1 for n in nodes if n.op == "call_function" and n.target is not operator.getitem)


def _common_module(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths if p]
    if not parts:
        return ""
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def find_windows(gm: fx.GraphModule, patterns: Sequence[str], max_nodes: int,
                 within: set[int] | None = None) -> tuple[list[Window], list[Window]]:
    """(windows of <= ``max_nodes`` compute nodes, larger sites) of ``patterns`` in ``gm``, in graph order."""
    from torchinferno.graph.patterns import apply_pattern

    if max_nodes < 1:
        raise ConfigError(f"--max-nodes must be >= 1, got {max_nodes}")
    by_id = nodes_by_id(gm)
    fit, large, seen = [], [], set()
    for pattern in patterns:
        res = apply_pattern(copy.deepcopy(gm), pattern)
        for m in res["matches"]:
            ids = sorted(m["matched_ids"])
            key = (pattern, tuple(ids))
            if not ids or key in seen or (within is not None and not set(ids) <= within):
                continue
            seen.add(key)
            nodes = [by_id[i] for i in ids]
            w = Window(pattern, ids, compute_node_count(nodes), [target_name(n) for n in nodes],
                       _common_module([module_path(n) for n in nodes]), m.get("variant", ""))
            (fit if w.compute_nodes <= max_nodes else large).append(w)
    order = lambda w: (w.node_ids[0], w.compute_nodes)  # noqa: E731
    return sorted(fit, key=order), sorted(large, key=order)


def _materialize(t: torch.Tensor, device: torch.device, g: torch.Generator) -> torch.Tensor:
    if t.device.type != "meta":
        return t.detach().to(device)
    if t.is_floating_point():
        return torch.randn(tuple(t.shape), generator=g, dtype=torch.float32).to(device=device, dtype=t.dtype)
    return torch.zeros(tuple(t.shape), dtype=t.dtype, device=device)


def _retarget_devices(gm: fx.GraphModule, device: torch.device) -> None:
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.kwargs.get("device"), torch.device) and n.kwargs["device"] != device:
            n.kwargs = {**n.kwargs, "device": device}
            changed = True
    if changed:
        gm.recompile()


def window_case(gm: fx.GraphModule, window: Window, device: str | torch.device, seed: int = 0):
    """(standalone subgraph of ``window`` on ``device``, its boundary inputs): random, seeded."""
    from torchinferno.graph.subgraph import extract_subgraph

    dev = torch.device(device)
    sub, spec = extract_subgraph(gm, window.node_ids)
    g = torch.Generator().manual_seed(seed)
    for name in sorted({str(n.target) for n in sub.graph.nodes if n.op == "get_attr"}):
        t = _materialize(getattr(sub, name), dev, g)  # extract_subgraph names constants flat
        delattr(sub, name)  # may be a Parameter: re-register as a plain buffer
        sub.register_buffer(name, t)
    _retarget_devices(sub, dev)
    inputs = []
    for d in spec.boundary_inputs:
        if not isinstance(d.get("shape"), list) or d.get("dtype") in (None, "tuple"):
            raise ConfigError(f"window {window.node_ids}: boundary input {d['name']} is not a single tensor")
        dtype = getattr(torch, d["dtype"].replace("torch.", ""))
        inputs.append(_materialize(torch.empty(tuple(d["shape"]), dtype=dtype, device="meta"), dev, g))
    return sub, inputs
