"""v0: the reference deepseek-v4 model (reference ops). The oracle for every child."""

from torchinferno.models.deepseek_v4 import raw_ops
from torchinferno.models.deepseek_v4.model import DeepSeekV4ForCausalLM


class DeepSeekV4V0(DeepSeekV4ForCausalLM):
    def __init__(self, config):
        super().__init__(config, ops=raw_ops)
