"""Provenance ladder of the deepseek-v3.2 family: every variant, its parent, class, ops module and status."""

from torchinferno.models.variants import Variant

VARIANTS = {
    "v0": Variant(
        name="v0", parent=None, class_path="torchinferno.models.deepseek_v32.v0:DeepSeekV32V0",
        ops_module="torchinferno.models.deepseek_v32.raw_ops", status="reference",
        notes="readable reference: latent-only MLA cache, absorbed decode, DSA indexer top-k, grouped-by-expert MoE; "
              "validated vs transformers DeepseekV3/V32ForCausalLM",
    ),
    "v1": Variant(
        name="v1", parent="v0", class_path="torchinferno.models.deepseek_v32.v1:DeepSeekV32V1",
        ops_module="torchinferno.models.deepseek_v32.fused_ops", status="validated",
        notes="RMSNorm / SwiGLU / neox rope routed to torchinferno.kernels; MLA, indexer and MoE still reference",
    ),
    "tp-v0": Variant(
        name="tp-v0", parent="v0", class_path="torchinferno.models.deepseek_v32.v0:DeepSeekV32V0",
        ops_module="torchinferno.models.deepseek_v32.raw_ops", status="validated", tensor_parallel=2,
        notes="v0 sharded over --tensor-parallel-size ranks (models/deepseek_v32/parallel.py); checked at TP=2 on gloo by "
              "validate-model-variants --include-tensor-parallel",
    ),
    "pipeline-v0": Variant(
        name="pipeline-v0", parent="v0", class_path="torchinferno.models.deepseek_v32.v0:DeepSeekV32V0",
        ops_module="torchinferno.models.deepseek_v32.raw_ops", status="validated", pipeline_parallel=2,
        notes="v0 in --pipeline-parallel-size stages of layers (parallel/pipeline.py; no micro-batch overlap yet); "
              "checked at 2 stages on gloo by validate-model-variants --include-tensor-parallel",
    ),
}
DEFAULT_VARIANT = "v1"
