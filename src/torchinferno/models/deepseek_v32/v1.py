"""v1: first optimized child of v0 — same module tree, norms/activation/neox rope routed to ``torchinferno.kernels``."""

from torchinferno.models.deepseek_v32 import fused_ops
from torchinferno.models.deepseek_v32.model import DeepSeekV32ForCausalLM


class DeepSeekV32V1(DeepSeekV32ForCausalLM):
    def __init__(self, config, absorb_decode: bool = True):
        super().__init__(config, ops=fused_ops, absorb_decode=absorb_decode)
