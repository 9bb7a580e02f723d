"""Llama-3 architecture family (GQA, RMSNorm, SwiGLU, llama3 rope scaling, tied/untied head)."""
