"""v0: the reference dsv4 model (reference ops; every batch, decode included, on the expanded
latent path). The oracle for every child."""

from torchinferno.models.dsv4 import raw_ops
from torchinferno.models.dsv4.model import DSv4ForCausalLM


class DSv4V0(DSv4ForCausalLM):
    def __init__(self, config):
        super().__init__(config, ops=raw_ops, absorb_decode=False)
