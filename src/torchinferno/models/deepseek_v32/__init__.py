"""DeepSeek-V3 / V3.2 family: MLA with a latent-only KV cache (weight absorption on decode),
DeepSeek Sparse Attention lightning indexer, sigmoid group-limited MoE with shared experts, YaRN."""
