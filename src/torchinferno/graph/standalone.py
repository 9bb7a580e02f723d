"""Turn a GraphModule into standalone Python source (a ``torch.nn.Module`` class, no FX needed).

The generated class takes its constants (weights the graph reads through get_attr) as a dict in
``__init__`` and registers them as buffers under the graph's attribute names; ``forward`` is
FX's generated code verbatim. Only ``torch`` is needed to run it, plus
``torchinferno.kernels.custom_ops`` when the graph calls ``torch.ops.torchinferno.*``.
"""

from __future__ import annotations

import textwrap

import torch
from torch import fx

PRELUDE = '''import math
import operator

import torch
from torch import device  # noqa: F401  (FX code spells devices as device(type='cpu'))

inf, nan = math.inf, math.nan
'''


def constant_names(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "get_attr"]


def constants_of(gm: fx.GraphModule) -> dict[str, torch.Tensor]:
    out = {}
    for name in constant_names(gm):
        obj = gm
        for part in name.split("."):
            obj = getattr(obj, part)
        out[name] = obj.detach() if isinstance(obj, torch.Tensor) else obj
    return out


def module_source(gm: fx.GraphModule, class_name: str = "Graph") -> str:
    """Python source defining ``class_name(constants: dict)``; requires flat attribute names."""
    names = constant_names(gm)
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ValueError(f"standalone export needs flat get_attr names, got {bad[0]!r}")
    code = gm.code.strip("\n")
    needs_custom = "torch.ops.torchinferno" in code
    head = PRELUDE + ("import torchinferno.kernels.custom_ops  # noqa: F401  (registers torch.ops.torchinferno)\n"
                      if needs_custom else "")
    body = textwrap.indent(code, "    ")
    return (f"{head}\n\nclass {class_name}(torch.nn.Module):\n"
            f"    def __init__(self, constants: dict):\n"
            f"        super().__init__()\n"
            f"        for name in {names!r}:\n"
            f"            self.register_buffer(name, constants[name])\n\n"
            f"{body}\n")
