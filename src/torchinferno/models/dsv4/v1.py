"""v1: first optimized child of v0 — same module tree and weights; decode attends over the
latent cache with ``kv_b_proj`` absorbed, norms/activation/neox rope routed to ``torchinferno.kernels``."""

from torchinferno.models.dsv4 import fused_ops
from torchinferno.models.dsv4.model import DSv4ForCausalLM


class DSv4V1(DSv4ForCausalLM):
    def __init__(self, config):
        super().__init__(config, ops=fused_ops, absorb_decode=True)
