"""Provenance ladder of the dsv4 family: every variant, its parent, class, ops module and status."""

from torchinferno.models.variants import Variant, parallel_variants

VARIANTS = {
    "v0": Variant(
        name="v0", parent=None, class_path="torchinferno.models.dsv4.v0:DSv4V0",
        ops_module="torchinferno.models.dsv4.raw_ops", status="reference",
        notes="readable reference: latent-only cache, expanded latent attention for every batch, grouped-by-expert MoE",
    ),
    "v1": Variant(
        name="v1", parent="v0", class_path="torchinferno.models.dsv4.v1:DSv4V1",
        ops_module="torchinferno.models.dsv4.fused_ops", status="validated",
        notes="absorbed decode over the latent cache; RMSNorm / SwiGLU / neox rope routed to torchinferno.kernels; "
              "on CUDA: fused MoE + routing, paged MLA decode, CUDA-graph capturable decode",
    ),
}
VARIANTS.update(parallel_variants(VARIANTS["v0"], "models/dsv4/parallel.py"))
DEFAULT_VARIANT = "v1"
