"""Provenance ladder of the dsv4 family: every variant, its parent, class, ops module and status."""

from torchinferno.models.variants import Variant

VARIANTS = {
    "v0": Variant(
        name="v0", parent=None, class_path="torchinferno.models.dsv4.v0:DSv4V0",
        ops_module="torchinferno.models.dsv4.raw_ops", status="reference",
        notes="readable reference: latent-only cache, expanded latent attention for every batch, grouped-by-expert MoE",
    ),
    "v1": Variant(
        name="v1", parent="v0", class_path="torchinferno.models.dsv4.v1:DSv4V1",
        ops_module="torchinferno.models.dsv4.fused_ops", status="validated",
        notes="absorbed decode over the latent cache; RMSNorm / SwiGLU / neox rope routed to torchinferno.kernels",
    ),
    "tp-v0": Variant(
        name="tp-v0", parent="v0", class_path="torchinferno.models.dsv4.v0:DSv4V0",
        ops_module="torchinferno.models.dsv4.raw_ops", status="validated", tensor_parallel=2,
        notes="v0 sharded over --tensor-parallel-size ranks (models/dsv4/parallel.py); checked at TP=2 on gloo by "
              "validate-model-variants --include-tensor-parallel",
    ),
    "pipeline-v0": Variant(
        name="pipeline-v0", parent="v0", class_path="torchinferno.models.dsv4.v0:DSv4V0",
        ops_module="torchinferno.models.dsv4.raw_ops", status="validated", pipeline_parallel=2,
        notes="v0 in --pipeline-parallel-size stages of layers (parallel/pipeline.py; no micro-batch overlap yet); "
              "checked at 2 stages on gloo by validate-model-variants --include-tensor-parallel",
    ),
}
DEFAULT_VARIANT = "v1"
