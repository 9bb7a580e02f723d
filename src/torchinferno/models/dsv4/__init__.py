"""dsv4: a compact, CPU-fast DeepSeek-style family *local to TorchInferno* — not DeepSeek-V4.

Latent KV attention (MLA-style cache ``[c_kv | k_pe]``, optional query LoRA, absorbed decode in
v1) and a small sigmoid-routed MoE with a shared expert, in a few layers. Deliberately simpler
than ``deepseek_v32``: no sparse-attention indexer, no group-limited routing, no YaRN, no MTP.
Meant for cache / compiler / serving experiments; the public DeepSeek-V4 architecture is a
separate family (``deepseek-v4``).
"""
