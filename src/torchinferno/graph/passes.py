"""Graph passes on FX graphs and an ordered, named registry that reports what each pass changed.

A pass is ``fn(gm) -> int``: it rewrites ``gm`` in place and returns how many sites it changed
(0 = no-op). Passes are opt-in: nothing here runs unless a workbench asks for it, and nothing in
the runtime path imports this module.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from torch import fx, nn

from torchinferno.errors import ConfigError
from torchinferno.graph.capture import module_path, op_histogram, target_name

GraphPass = Callable[[fx.GraphModule], int]


@dataclass
class PassReport:
    """What one pass did: sites changed, node counts and the op histogram delta (``+n``/``-n``)."""

    name: str
    changed: int
    nodes_before: int
    nodes_after: int
    op_delta: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class PassRegistry:
    """Ordered named passes. ``run`` applies them in registration order (or the ``only`` subset).

    Invariant: names are unique; ``run`` returns one ``PassReport`` per pass applied, in order,
    and recompiles the GraphModule after every pass that changed something.
    """

    def __init__(self) -> None:
        self._passes: dict[str, tuple[GraphPass, str]] = {}

    def register(self, name: str, fn: GraphPass, description: str = "") -> "PassRegistry":
        if name in self._passes:
            raise ConfigError(f"pass '{name}' is already registered")
        self._passes[name] = (fn, description)
        return self

    def names(self) -> list[str]:
        return list(self._passes)

    def describe(self) -> list[dict]:
        return [{"name": n, "description": d} for n, (_, d) in self._passes.items()]

    def run(self, gm: fx.GraphModule, only: list[str] | None = None) -> list[PassReport]:
        names = self.names() if only is None else only
        unknown = [n for n in names if n not in self._passes]
        if unknown:
            raise ConfigError(f"unknown pass '{unknown[0]}' (valid: {', '.join(self.names()) or 'none registered'})")
        reports = []
        for name in names:
            fn = self._passes[name][0]
            before, n_before = op_histogram(gm), len(gm.graph.nodes)
            t0 = time.perf_counter()
            changed = int(fn(gm) or 0)
            if changed:
                gm.graph.lint()
                gm.recompile()
            after = op_histogram(gm)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
            reports.append(PassReport(name, changed, n_before, len(gm.graph.nodes),
                                      {k: v for k, v in sorted(delta.items()) if v}, time.perf_counter() - t0))
        return reports


def _matcher(match: str | Callable[[fx.Node], bool]) -> Callable[[fx.Node], bool]:
    if callable(match):
        return match
    rx = re.compile(match)
    return lambda n: n.op not in ("placeholder", "output") and bool(
        rx.search(target_name(n)) or rx.search(module_path(n)))


def annotate_matching_nodes(gm: fx.GraphModule, match: str | Callable[[fx.Node], bool], key: str, value: Any = True) -> int:
    """Set ``node.meta[key] = value`` on every node matching ``match``; returns the count.

    ``match`` is a predicate or a regex searched in the node's target name and module path
    (``"aten.mm"``, ``"layers\\.0\\.mlp"``).
    """
    pred, count = _matcher(match), 0
    for node in gm.graph.nodes:
        if pred(node):
            node.meta[key] = value
            count += 1
    return count


def replace_call_function_targets(gm: fx.GraphModule, mapping: dict[Any, Callable],
                                  where: Callable[[fx.Node], bool] | None = None) -> int:
    """Point every ``call_function`` node whose target is a key of ``mapping`` at the new callable.

    Arguments are kept as they are, so a replacement must accept the same signature (e.g.
    ``aten.silu.default -> torch.ops.mylib.silu.default``). Returns the number of nodes rewired.
    """
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in mapping and (where is None or where(node)):
            node.target = mapping[node.target]
            count += 1
    if count:
        gm.recompile()
    return count


def replace_call_module_targets(gm: fx.GraphModule, replacements: dict[str, nn.Module]) -> int:
    """Swap the submodule called at each path in ``replacements`` and rewire its call sites.

    For every key (a submodule path used by ``call_module`` nodes, e.g. ``"mlp.act"``), the new
    module is installed under a fresh name (``mlp_act__replaced``) and each ``call_module`` node
    targeting the old path is pointed at it; old submodules no longer called are deleted. Returns
    the number of nodes rewired. Unknown paths raise ``ConfigError`` listing the called paths.
    """
    called = sorted({n.target for n in gm.graph.nodes if n.op == "call_module"})
    for path in replacements:
        if path not in called:
            raise ConfigError(f"no call_module node targets '{path}' (called modules: {', '.join(called) or 'none'})")
    count = 0
    for path, module in replacements.items():
        new_name = path.replace(".", "_") + "__replaced"
        gm.add_submodule(new_name, module)
        for node in gm.graph.nodes:
            if node.op == "call_module" and node.target == path:
                node.target = new_name
                count += 1
    if count:
        gm.delete_all_unused_submodules()
        gm.graph.lint()
        gm.recompile()
    return count


def dead_code_elimination(gm: fx.GraphModule) -> int:
    """Remove side-effect-free nodes without users (in-place ATen ops are kept)."""
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code()
    return before - len(gm.graph.nodes)
