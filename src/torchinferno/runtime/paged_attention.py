"""``torchinferno.runtime.paged_attention``: the torch paged causal attention reference (thin re-exports of
``models.common.attention.TorchAttention`` and ``kernels.api``'s reference and decode entries)."""

from torchinferno.kernels.api import batched_paged_decode_attention, paged_attention_reference, paged_decode_attention
from torchinferno.models.common.attention import TorchAttention, gather_kv, write_kv

__all__ = ["TorchAttention", "paged_attention_reference", "paged_decode_attention", "batched_paged_decode_attention",
           "gather_kv", "write_kv"]
