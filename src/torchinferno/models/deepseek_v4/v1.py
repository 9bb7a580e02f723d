"""v1: first optimized child of v0 — same module tree, norms/activation routed to ``torchinferno.kernels``."""

from torchinferno.models.deepseek_v4 import fused_ops
from torchinferno.models.deepseek_v4.model import DeepSeekV4ForCausalLM


class DeepSeekV4V1(DeepSeekV4ForCausalLM):
    def __init__(self, config):
        super().__init__(config, ops=fused_ops)
