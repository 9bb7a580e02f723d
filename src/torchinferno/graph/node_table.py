"""Plain-data views of a captured graph: ``graph.json`` records, the ``graph.txt`` table, a signature.

A record per node (in id order)::

    {"id": 42, "name": "mm_3", "op": "call_function", "target": "aten.mm.default",
     "module": "model.layers.0.mlp.gate_up_proj", "param": null,
     "inputs": [40, 41], "users": [43], "args": [{"node": 40}, {"node": 41}],
     "shapes": [[10, 256]], "dtypes": ["torch.float32"]}

``inputs``/``users`` hold node ids (graph edges); ``args`` keeps literals (ints, floats, lists)
with node references written as ``{"node": id}``; ``shapes``/``dtypes`` list every tensor the node
produces (one entry for a tensor, several for a tuple). The signature hashes the op/target
sequence: two traces with the same signature have the same node ids.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from torch import fx

from torchinferno.graph.capture import NODE_ID, PARAM_NAME, module_path, target_name


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _render_arg(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return {"node": a.meta.get(NODE_ID), "name": a.name}
    if isinstance(a, (list, tuple)):
        return [_render_arg(x) for x in a]
    if isinstance(a, dict):
        return {str(k): _render_arg(v) for k, v in a.items()}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        return a if a == a and a not in (float("inf"), float("-inf")) else str(a)
    return str(a)


def node_record(node: fx.Node) -> dict:
    tensors = _tensors(node.meta.get("val"))
    inputs = [n.meta.get(NODE_ID) for n in node.all_input_nodes]
    return {
        "id": node.meta.get(NODE_ID),
        "name": node.name,
        "op": node.op,
        "target": target_name(node) if node.op not in ("placeholder", "output") else str(node.target),
        "module": module_path(node),
        "param": node.meta.get(PARAM_NAME),
        "inputs": inputs,
        "users": [u.meta.get(NODE_ID) for u in node.users],
        "args": _render_arg(list(node.args)),
        "kwargs": _render_arg(dict(node.kwargs)),
        "shapes": [list(t.shape) for t in tensors],
        "dtypes": [str(t.dtype) for t in tensors],
    }


def node_records(gm: fx.GraphModule) -> list[dict]:
    return [node_record(n) for n in gm.graph.nodes]


def graph_signature(gm: fx.GraphModule) -> str:
    """sha256 over ``(op, target)`` in node order: equal signatures => the same node ids."""
    h = hashlib.sha256()
    for n in gm.graph.nodes:
        h.update(f"{n.op}|{target_name(n) if n.op != 'output' else 'output'};".encode())
    return h.hexdigest()[:16]


def format_record(r: dict) -> str:
    """One ``graph.txt`` / ``profile-nodes`` line: id, op, target, shapes, module."""
    shape = " ".join("x".join(str(d) for d in s) or "scalar" for s in r["shapes"]) or "-"
    extra = f" [{r['param']}]" if r.get("param") else ""
    rid = "-" if r["id"] is None else r["id"]
    return f"{rid:>5}  {r['op']:<13} {r['target']:<48} {shape:<22} {r['module'] or '-'}{extra}"


def graph_table(records: list[dict]) -> str:
    head = f"{'id':>5}  {'op':<13} {'target':<48} {'shape':<22} module [param]"
    return "\n".join([head] + [format_record(r) for r in records]) + "\n"


def graph_json(gm: fx.GraphModule, extra: dict | None = None) -> dict:
    recs = node_records(gm)
    return {"signature": graph_signature(gm), "num_nodes": len(recs), **(extra or {}), "nodes": recs}


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1)
