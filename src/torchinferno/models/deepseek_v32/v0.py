"""v0: the reference deepseek-v3.2 model (reference ops, latent-cache MLA). The oracle for every child."""

from torchinferno.models.deepseek_v32 import raw_ops
from torchinferno.models.deepseek_v32.model import DeepSeekV32ForCausalLM


class DeepSeekV32V0(DeepSeekV32ForCausalLM):
    def __init__(self, config, absorb_decode: bool = True):
        super().__init__(config, ops=raw_ops, absorb_decode=absorb_decode)
