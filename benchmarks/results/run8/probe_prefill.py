"""Probe (device only): Triton paged prefill, 8 fresh prompts x 1024 tokens, bf16 vs FP8 cache, Llama-3-8B heads."""
import torch

from torchinferno.bench.gpu_timing import graph_time_ms
from torchinferno.kernels.kv_dtype import kv_store_values
from torchinferno.kernels.triton import prefill_attention as pa

B, L, H, Hkv, D, page = 8, 1024, 32, 8, 128, 16
dev = "cuda"
nb = B * L // page
bt = torch.arange(nb, dtype=torch.int32, device=dev).view(B, L // page)
q = torch.randn(B * L, H, D, device=dev, dtype=torch.bfloat16)
qsl = torch.arange(0, B * L + 1, L, dtype=torch.int32, device=dev)
sl = torch.full((B,), L, dtype=torch.int32, device=dev)
for name, dt in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
    kc = kv_store_values(torch.randn(nb, page, Hkv, D, device=dev), dt)
    vc = kv_store_values(torch.randn(nb, page, Hkv, D, device=dev), dt)
    ms = graph_time_ms(lambda: pa.paged_prefill_attention(q, kc, vc, qsl, sl, bt, D**-0.5), calls=1)
    flops = 4 * B * H * D * L * (L + 1) / 2
    print(f"prefill attention {B}x{L} {name} cache: {ms * 1e3:.1f} us per layer, {flops / ms / 1e9:.0f} TFLOP/s")
