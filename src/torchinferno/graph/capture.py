"""Capture ATen graphs with ``make_fx`` and give every node a stable integer id.

Invariants:

* ``node.meta[NODE_ID]`` is the node's index in ``graph.nodes`` at capture time. Tracing the same
  function on the same inputs (same model, seed, shapes) yields the same ids, so an id printed by
  ``profile-nodes`` today names the same node when a later command re-traces the run.
* Passes never renumber: nodes they add carry no id (``node_id`` returns None) until
  ``assign_node_ids`` is called explicitly on the rewritten graph.
* ``node.meta["nn_module_stack"]`` is recorded when a root module is given, so every node knows
  which module (``model.layers.0.self_attn``) produced it; ``module_path`` reads it.
* get_attr nodes that hold a parameter or buffer of the root module carry its qualified name in
  ``node.meta[PARAM_NAME]``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import fx, nn

from torchinferno.errors import ConfigError

NODE_ID = "ti_node_id"
PARAM_NAME = "ti_param_name"


def trace_with_make_fx(fn: Callable[..., Any] | nn.Module, args: Sequence[Any], *, fake: bool = False,
                       module: nn.Module | None = None, decomposition_table: dict | None = None) -> fx.GraphModule:
    """Trace ``fn(*args)`` to an ATen-level ``GraphModule`` with stable node ids.

    ``fake=True`` traces with FakeTensors (no real compute, parameters may stay real or live on
    ``meta``); data-dependent control flow (``.tolist()`` of a traced tensor, MoE routing) cannot
    be traced that way and raises a ``ConfigError`` that says so. ``module`` is the root whose
    submodule paths are recorded on nodes (defaults to ``fn`` itself when it is a module).
    Tracing runs under ``torch.no_grad``: the graphs are inference graphs.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    root = module if module is not None else (fn if isinstance(fn, nn.Module) else None)

    def call(*a):
        return fn(*a)

    if root is not None:
        call._orig_mod = root  # make_fx records nn_module_stack relative to this root
    try:
        with torch.no_grad():
            gm = make_fx(call, decomposition_table=decomposition_table, tracing_mode="fake" if fake else "real",
                         _allow_non_fake_inputs=fake, record_module_stack=root is not None)(*args)
    except Exception as e:  # data-dependent ops are an input problem of fake tracing, not a bug
        name = type(e).__name__
        if fake and ("DataDependent" in name or "data-dependent" in str(e) or "DynamicOutputShape" in name):
            raise ConfigError(f"fake tracing hit a data-dependent op ({name}); trace with real tensors instead") from e
        raise
    assign_node_ids(gm)
    if root is not None:
        annotate_param_names(gm, root)
    return gm


def assign_node_ids(gm: fx.GraphModule) -> int:
    """Number the nodes 0..N-1 in graph order (``node.meta[NODE_ID]``); returns N."""
    n = 0
    for n, node in enumerate(gm.graph.nodes):
        node.meta[NODE_ID] = n
    return n + 1 if len(gm.graph.nodes) else 0


def node_id(node: fx.Node) -> int | None:
    return node.meta.get(NODE_ID)


def nodes_by_id(gm: fx.GraphModule) -> dict[int, fx.Node]:
    return {node.meta[NODE_ID]: node for node in gm.graph.nodes if NODE_ID in node.meta}


def module_path(node: fx.Node) -> str:
    """Innermost module path that produced ``node`` (``""`` for the root or unknown)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _cls = list(stack.values())[-1]
    return _clean_path(str(path))


def module_class(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    cls = list(stack.values())[-1][1]
    return cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"


def _clean_path(path: str) -> str:
    # make_fx prefixes paths of modules reached through the root with "L['self']." in some versions.
    for prefix in ("L['self'].", "L__self__."):
        if path.startswith(prefix):
            path = path[len(prefix):]
    return path


def annotate_param_names(gm: fx.GraphModule, root: nn.Module) -> int:
    """Write the qualified parameter/buffer name into get_attr nodes whose tensor belongs to ``root``."""
    owners: dict[int, str] = {}
    for name, t in list(root.named_parameters()) + list(root.named_buffers()):
        owners.setdefault(id(t), name)
        owners.setdefault(_storage_key(t), name)
    count = 0
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        t = getattr(gm, node.target, None)
        if not isinstance(t, torch.Tensor):
            continue
        name = owners.get(id(t)) or owners.get(_storage_key(t))
        if name is not None:
            node.meta[PARAM_NAME] = name
            count += 1
    return count


def _storage_key(t: torch.Tensor):
    if t.device.type == "meta":
        return ("meta", id(t))
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
    except Exception:
        return ("opaque", id(t))


def op_histogram(gm: fx.GraphModule) -> dict[str, int]:
    """``{target string: count}`` over call nodes (what a pass changed shows up here)."""
    hist: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            key = target_name(node)
            hist[key] = hist.get(key, 0) + 1
    return hist


def target_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    name = getattr(t, "__name__", None)
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    mod = getattr(t, "__module__", None)
    if name and mod in ("_operator", "operator"):
        return f"operator.{name}"
    return str(t) if name is None else (f"{mod}.{name}" if mod and mod != "builtins" else name)
