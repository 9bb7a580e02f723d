"""Provenance ladder of the deepseek-v4 family: every variant, its parent, class, ops module and status."""

from torchinferno.models.variants import Variant, parallel_variants

VARIANTS = {
    "v0": Variant(
        name="v0", parent=None, class_path="torchinferno.models.deepseek_v4.v0:DeepSeekV4V0",
        ops_module="torchinferno.models.deepseek_v4.raw_ops", status="reference",
        notes="readable reference: mHC streams, sliding/CSA/HCA attention with sinks, per-token cache rows with "
              "compressed entries recomputed each forward, hash/top-k routed clamped-SwiGLU MoE; validated vs "
              "transformers DeepseekV4ForCausalLM",
    ),
    "v1": Variant(
        name="v1", parent="v0", class_path="torchinferno.models.deepseek_v4.v1:DeepSeekV4V1",
        ops_module="torchinferno.models.deepseek_v4.fused_ops", status="validated",
        notes="norms / SwiGLU ops routed to torchinferno.kernels; clamped experts fused on CUDA (kernels.fused_moe); "
              "decode-only steps static-shape (decode.py: no host sync, CUDA-graph capturable) with the Triton "
              "sparse-sink attention on CUDA (kernels.sparse_sink_decode); prefill attention and compressor reference",
    ),
}
VARIANTS.update(parallel_variants(VARIANTS["v0"], "models/deepseek_v4/parallel.py"))  # pipeline stages carry the mHC streams
DEFAULT_VARIANT = "v1"
