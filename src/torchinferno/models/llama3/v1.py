"""v1: first optimized child of v0 — same module tree, ops routed to ``torchinferno.kernels``."""

from torchinferno.models.llama3 import fused_ops
from torchinferno.models.llama3.model import Llama3ForCausalLM


class Llama3V1(Llama3ForCausalLM):
    def __init__(self, config, attention_backend=None):
        kw = {} if attention_backend is None else {"attention_backend": attention_backend}
        super().__init__(config, ops=fused_ops, **kw)
