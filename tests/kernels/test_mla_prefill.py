"""MLA prefill through the flash-eligible form (kernels/mla_prefill.py): values zero-padded to the qk head dim, plain
causal SDPA (no mask tensor) == the reference ``mla_expanded_attention``; a chunk over a cached context
(``context_len``: lower-right causal, no mask tensor) == the masked reference, and the model takes that form for its
second prefill chunk; masked calls are the reference itself. On
CUDA (skipped without) the padded form runs under the flash backend alone (it is eligible) at DeepSeek's head dims.
The in-place Triton kernel (``PREFILL_KERNEL = "triton"``; checks in mla_prefill_checks.py) == the reference on
Triton's interpreter and, at DeepSeek's head dims, on CUDA."""

from __future__ import annotations

import pytest
import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mla_prefill_checks import _inputs  # noqa: E402

from torchinferno.kernels.mla_prefill import expanded_attention  # noqa: E402
from torchinferno.models.common.mla import mla_expanded_attention  # noqa: E402


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("dn,dv,r", [(16, 16, 8), (12, 20, 4), (8, 24, 8)])  # dv > dn + r: falls back
def test_padded_values_equal_the_reference(dtype, tol, dn, dv, r):
    q_nope, q_pe, latent, w = _inputs(37, 37, 3, dn, dv, 32, r, dtype, "cpu")
    scale = (dn + r) ** -0.5
    got = expanded_attention(q_nope, q_pe, latent, w, scale, None, pad_v=True)
    want = mla_expanded_attention(q_nope.float(), q_pe.float(), latent.float(), w.float(), scale, None)
    assert got.shape == (37, 3, dv) and got.dtype == dtype
    assert _rel(got, want) <= tol


def test_masked_calls_are_the_reference():
    q_nope, q_pe, latent, w = _inputs(5, 12, 2, 8, 8, 16, 4, torch.float32, "cpu", seed=1)
    mask = torch.arange(12)[None, :] <= (7 + torch.arange(5))[:, None]
    got = expanded_attention(q_nope, q_pe, latent, w, 0.3, mask, pad_v=True)
    assert torch.equal(got, mla_expanded_attention(q_nope, q_pe, latent, w, 0.3, mask))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefill_runs_the_flash_backend_cuda(monkeypatch):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torchinferno.kernels import mla_prefill

    monkeypatch.setattr(mla_prefill, "PREFILL_KERNEL", "sdpa")

    q_nope, q_pe, latent, w = _inputs(1000, 1000, 16, 128, 128, 512, 64, torch.bfloat16, "cuda")
    scale = 192**-0.5
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if the padded form were not flash-eligible
        got = expanded_attention(q_nope, q_pe, latent, w, scale, None)
    want = mla_expanded_attention(q_nope.float(), q_pe.float(), latent.float(), w.float(), scale, None)
    assert _rel(got, want) <= 2e-2


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("dn,dv,r", [(16, 16, 8), (8, 24, 8)])  # dv > dn + r: the reference with the built mask
def test_context_chunk_lower_right_equals_the_masked_reference(dtype, tol, dn, dv, r):
    """A prompt chunk of 9 queries after 14 cached keys (``context_len``, no mask tensor) == the reference with
    the boolean [Q, S] mask the model used to build; padded (flash form) and not."""
    q_nope, q_pe, latent, w = _inputs(9, 23, 3, dn, dv, 32, r, dtype, "cpu", seed=2)
    mask = torch.arange(23)[None, :] <= (14 + torch.arange(9))[:, None]
    want = mla_expanded_attention(q_nope.float(), q_pe.float(), latent.float(), w.float(), (dn + r) ** -0.5, mask)
    for pad_v in (True, False):
        got = expanded_attention(q_nope, q_pe, latent, w, (dn + r) ** -0.5, None, pad_v=pad_v, context_len=14)
        assert got.shape == (9, 3, dv) and got.dtype == dtype
        assert _rel(got, want) <= tol, pad_v
    with pytest.raises(AssertionError):
        expanded_attention(q_nope, q_pe, latent, w, 0.3, None, pad_v=True, context_len=13)


def test_model_chunked_prefill_takes_the_context_form_and_matches_raw_ops():
    """Tiny deepseek-v3 (fused ops, CPU): a 10-token prompt prefilled in chunks 6 + 4 calls the prefill attention
    with ``context_len`` for the second chunk, and its logits == raw ops' (boolean mask)."""
    from torchinferno.kernels import mla_prefill
    from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
    from torchinferno.models.deepseek_v32 import fused_ops, raw_ops
    from torchinferno.testing import tiny_model

    model = tiny_model("deepseek-v3.2", size="debug-v3-no-q-lora")
    ids = torch.tensor([5, 17, 99, 3, 42, 7, 8, 11, 2, 60])
    seen = []
    real = mla_prefill.expanded_attention

    def spy(*a, context_len=0, **k):
        seen.append(context_len)
        return real(*a, context_len=context_len, **k)

    outs = []
    for ops in (raw_ops, fused_ops):
        for m in model.modules():
            if hasattr(m, "ops"):
                m.ops = ops
        caches = model.family.kv_spec(model.config).allocate(num_blocks=5, block_size=4, dtype=torch.float32,
                                                             device=torch.device("cpu"))
        table = [[3, 1, 4]]
        with torch.no_grad():
            model(ids[:6], positions_for([6], [0]), caches, build_attention_metadata([6], [0], table, 4))
            fused_ops.mla_expanded_attention = spy
            try:
                h = model(ids[6:], positions_for([4], [6]), caches, build_attention_metadata([4], [6], table, 4))
            finally:
                fused_ops.mla_expanded_attention = real
            outs.append(model.compute_logits(h))
    assert seen and set(seen) == {6}, seen
    assert _rel(outs[1], outs[0]) <= 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_context_chunk_runs_the_flash_backend_cuda(monkeypatch):
    """A 512-query chunk after 1536 cached keys at DeepSeek's head dims: lower-right causal under the flash backend
    alone (no mask tensor) == the masked fp32 reference."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torchinferno.kernels import mla_prefill

    monkeypatch.setattr(mla_prefill, "PREFILL_KERNEL", "sdpa")

    q_nope, q_pe, latent, w = _inputs(512, 2048, 16, 128, 128, 512, 64, torch.bfloat16, "cuda", seed=3)
    scale = 192**-0.5
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        got = expanded_attention(q_nope, q_pe, latent, w, scale, None, context_len=1536)
    mask = torch.arange(2048, device="cuda")[None, :] <= (1536 + torch.arange(512, device="cuda"))[:, None]
    want = mla_expanded_attention(q_nope.float(), q_pe.float(), latent.float(), w.float(), scale, mask)
    assert _rel(got, want) <= 2e-2


def test_triton_prefill_kernel_on_the_interpreter(interpreter_check):
    interpreter_check("mla_prefill_checks.py", "kernel")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("Q,ctx", [(2048, 0), (512, 1536), (1000, 0)])
def test_triton_prefill_kernel_cuda(Q, ctx):
    """DeepSeek's head dims (16 heads, dn 128, dv 128, rope 64, latent 512), bf16: a fresh prompt and a chunk over a
    cached context == the fp32 reference (and its sabotage control fails)."""
    import mla_prefill_checks as C

    C.run_case(torch.device("cuda"), torch.bfloat16, Q, ctx, 16, 128, 128, 64, 512, seed=Q)
