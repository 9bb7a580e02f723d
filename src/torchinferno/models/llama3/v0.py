"""v0: the reference llama3 model (reference ops, torch attention). The oracle for every child."""

from torchinferno.models.llama3 import raw_ops
from torchinferno.models.llama3.model import Llama3ForCausalLM


class Llama3V0(Llama3ForCausalLM):
    def __init__(self, config, attention_backend=None):
        kw = {} if attention_backend is None else {"attention_backend": attention_backend}
        super().__init__(config, ops=raw_ops, **kw)
