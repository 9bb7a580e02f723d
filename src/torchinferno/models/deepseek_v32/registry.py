"""Provenance ladder of the deepseek-v3.2 family: every variant, its parent, class, ops module and status."""

from torchinferno.models.variants import Variant, parallel_variants

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
        notes="RMSNorm / SwiGLU / neox rope routed to torchinferno.kernels; on CUDA: fused MoE + one-launch routing "
              "(kernels.fused_moe), paged MLA decode (kernels.mla_decode), CUDA-graph capturable decode; indexer "
              "scoring and prefill attention still reference",
    ),
}
VARIANTS.update(parallel_variants(VARIANTS["v0"], "models/deepseek_v32/parallel.py"))
DEFAULT_VARIANT = "v1"
