"""Graph-pass registration for kernel replacements (the documented
``torchinferno.kernels.passes.register_kernel_replacement_passes``).

Offline only: this wires the graph toolkit (``graph.passes``, ``graph.patterns``) to the kernel APIs;
the runtime path never imports it. Every pass is opt-in, run through a ``PassRegistry``:

* ``kernel-leaf-calls``: ``call_function`` nodes of the torch references (``kernels.reference``,
  e.g. in a symbolic ``torch.fx`` trace) are pointed at the dispatching APIs with the same signature;
* ``pattern:<name>`` for each library pattern in ``graph.patterns.PATTERNS`` (on ``make_fx`` ATen
  graphs): e.g. residual add + RMSNorm + gate/up projection + SwiGLU -> ``fused_rmsnorm_swiglu``.
"""

from __future__ import annotations

from torch import fx

from torchinferno.graph.passes import PassRegistry, replace_call_function_targets
from torchinferno.graph.patterns import PATTERNS, apply_pattern
from torchinferno.kernels import api, reference

__all__ = ["register_kernel_replacement_passes", "LEAF_REPLACEMENTS"]

# reference -> API; same argument order and results, so a node's arguments stay as they are.
LEAF_REPLACEMENTS = {
    reference.ref_rms_norm: api.rms_norm,
    reference.ref_add_rms_norm: api.add_rms_norm,
    reference.ref_swiglu: api.swiglu_activation,
    reference.ref_rotary_neox: api.rotary_neox,
}


def _pattern_pass(name: str):
    def run(gm: fx.GraphModule) -> int:
        return apply_pattern(gm, name)["replaced"]

    return run


def register_kernel_replacement_passes(registry: PassRegistry | None = None) -> PassRegistry:
    """Add the kernel-replacement passes to ``registry`` (a new one when None) and return it.

    Invariant: each pass rewrites in place and returns the number of sites it changed; passes
    whose pattern is absent from a graph change nothing (0)."""
    reg = registry if registry is not None else PassRegistry()
    reg.register("kernel-leaf-calls", lambda gm: replace_call_function_targets(gm, LEAF_REPLACEMENTS),
                 "torch reference calls -> kernels.api (same signature)")
    for name, spec in PATTERNS.items():
        reg.register(f"pattern:{name}", _pattern_pass(name), spec.description)
    return reg
