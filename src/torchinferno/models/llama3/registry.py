"""Provenance ladder of the llama3 family: every variant, its parent, class, ops module and status."""

from torchinferno.models.variants import Variant, parallel_variants

VARIANTS = {
    "v0": Variant(
        name="v0", parent=None, class_path="torchinferno.models.llama3.v0:Llama3V0",
        ops_module="torchinferno.models.llama3.raw_ops", status="reference",
        notes="readable reference: fp32 RMSNorm as HF, neox rope, torch SDPA attention over the paged cache",
    ),
    "v1": Variant(
        name="v1", parent="v0", class_path="torchinferno.models.llama3.v1:Llama3V1",
        ops_module="torchinferno.models.llama3.fused_ops", status="validated",
        notes="ops routed to torchinferno.kernels (F.rms_norm, fused residual add; Triton on CUDA when present)",
    ),
}
VARIANTS.update(parallel_variants(VARIANTS["v0"], "models/llama3/parallel.py"))
DEFAULT_VARIANT = "v1"
