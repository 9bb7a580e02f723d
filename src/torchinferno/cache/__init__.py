"""KV cache management: the paged block pool (ref counts, prefix caching) and cache tensors."""
