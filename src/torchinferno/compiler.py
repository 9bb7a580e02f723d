"""``torchinferno.compiler``: the documented import path of the explicit ``torch.compile`` experiment helper
(a thin re-export of ``torchinferno.graph.compile``; nothing is compiled at import)."""

from torchinferno.graph.compile import BACKENDS, CompileExperiment, CompileReport, compile_forward

__all__ = ["compile_forward", "CompileExperiment", "CompileReport", "BACKENDS"]
