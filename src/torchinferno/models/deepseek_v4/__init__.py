"""DeepSeek-V4 (transformers' ``deepseek_v4``): mHC residual, sliding / CSA / HCA attention, hash-routed MoE."""
