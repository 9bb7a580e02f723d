"""The lightning-indexer scores kernel (kernels/indexer_scores.py) against its torch reference, and the V4 / V3.2
models through it (checks in indexer_scores_checks.py).

CPU: the dispatch falls back to the reference, which is the V4 ``Indexer.select`` / V3.2 ``mla.indexer_scores``
arithmetic. Interpreter (``TRITON_INTERPRET=1`` subprocess): kernel == reference (fp32 / fp16, odd sizes, causal
limits, exact-zero ties, tile independence, sabotage controls); the tiny V4 v1 prefill and static decode with the
indexer kernel == without, chunked selections == full; the tiny V3.2 with kernel scores == raw ops. CUDA (skipped without): the same
at fp32 / bf16, V4-Flash's (64 heads x 128, top-512 over Q/4 entries) and V3.2's (64 x 128, top-2048 over Q tokens)
indexer shapes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from torchinferno.kernels import indexer_scores as iks

HERE = Path(__file__).resolve().parent


def _checks():
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import indexer_scores_checks as C

    return C


def test_reference_is_the_model_arithmetic():
    """``reference`` == V4's torch ``Indexer.scores`` (bitwise) and == ``mla.indexer_scores`` (V3.2, scale folded into
    w) to summation order; the dispatch without Triton is the reference; limits == the boolean mask."""
    from torchinferno.models.common import mla
    from torchinferno.models.deepseek_v4.compressor import Indexer, visible_entries

    C = _checks()
    q, k, w, _ = C.inputs("cpu", torch.float32, Q=13, S=9, Hi=8, D=16, causal=False)
    idx = Indexer(32, 24, 8, 16, 3, 4, 1e-6)
    pos = torch.arange(20, 33)
    vis = visible_entries(pos, 9, 4)
    lim = (pos + 1) // 4
    want = idx.scores(q, k, w, vis)
    assert torch.equal(iks.reference(q, k, w, 16**-0.5, lim), want)
    assert torch.equal(iks.indexer_scores(q, k, w, 16**-0.5, lim), want)  # CPU: no Triton path
    idx.score_kernel = True  # CPU: the dispatch's reference, the same bits
    assert torch.equal(idx.scores(q, k, w, vis, lim), want)
    assert torch.equal(idx.scores(q, k, w, vis), want)
    v32 = mla.masked_scores(mla.indexer_scores(q, k, w * 16**-0.5), vis)
    torch.testing.assert_close(iks.reference(q, k, w * 16**-0.5, 1.0, lim), v32, rtol=1e-6, atol=1e-6)
    assert torch.equal(mla.indexer_scores(q, k, w, lim), mla.masked_scores(mla.indexer_scores(q, k, w), vis))


def test_usable_gates():
    q, k = torch.zeros(2, 3, 16), torch.zeros(5, 16)
    assert not iks.usable(q, k)  # CPU


@pytest.mark.parametrize("check", ["kernel", "v4", pytest.param("v4decode", marks=pytest.mark.slow), "v32"])
def test_indexer_scores_on_the_triton_interpreter(check, interpreter_check):
    interpreter_check("indexer_scores_checks.py", check)


def cuda(test):
    """Marked ``cuda`` and skipped without a CUDA device."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_indexer_scores_cuda(dtype):
    C = _checks()
    dev = torch.device("cuda")
    C.check_kernel(dev, dtype)
    C.check_ties(dev, dtype)
    C.check_tile_independence(dev, dtype)
    if dtype == torch.float32:
        C.check_sabotage(dev, dtype)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", ["v4-flash", "v4-flash-chunk", "v32"])
def test_indexer_real_shapes_cuda(dtype, shape):
    C = _checks()
    kw = {"v4-flash": dict(Q=4096, S=1024, topk=512, rate=4),  # CSA: an entry per 4 tokens
          "v4-flash-chunk": dict(Q=700, S=1000, topk=512, rate=4, ctx=3300),  # a chunk over a cached context
          "v32": dict(Q=4096, S=4096, topk=2048, rate=1)}[shape]
    err, rows = C.check_real_shape(torch.device("cuda"), dtype, **kw)
    assert rows >= kw["Q"] // 2, f"only {rows} rows without a near-tie at the k-th score"


@cuda
def test_v4_model_cuda():
    _checks().check_v4(torch.device("cuda"))
    _checks().check_v4_decode(torch.device("cuda"))


@cuda
def test_v32_model_cuda():
    _checks().check_v32(torch.device("cuda"))
