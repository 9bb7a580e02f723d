"""DeepSeek-V4's prefill attention (kernels/sparse_sink_prefill.py) against the torch path ``V4Attention._attend``,
and the V4 model prefilling through it (checks in sparse_sink_prefill_checks.py).

CPU: the slot-list helpers and ``_attend`` == ``reference``. Interpreter (``TRITON_INTERPRET=1`` subprocess): kernel
== reference over sliding / HCA / CSA layers, fresh and chunked, fp32 and fp16, with sabotage controls; the tiny V4
v1 prefill (fresh and in 3 chunks) with the kernel == without. CUDA (skipped without): the same at fp32 / bf16,
V4-Flash's attention shape (64 heads of 512, window 128, top-512 of Q/4 CSA entries), the model in fp32 and bf16.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from torchinferno.kernels import sparse_sink_prefill as spp

HERE = Path(__file__).resolve().parent


def _checks():
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import sparse_sink_prefill_checks as C

    return C


def test_window_and_entry_slots():
    pos = torch.tensor([0, 3, 9])
    assert spp.window_slots(pos, 0, 4).tolist() == [[-1, -1, -1, 0], [0, 1, 2, 3], [6, 7, 8, 9]]
    assert spp.window_slots(pos[1:], 5, 4).tolist() == [[-1, -1, -1, -1], [1, 2, 3, 4]]  # keys start at lo = 5
    vis = torch.tensor([[False, True, False, True], [False, False, False, False], [True, True, True, False]])
    assert spp.entry_slots(vis).tolist() == [[-1, 1, -1, 3], [-1, -1, -1, -1], [0, 1, 2, -1]]
    assert spp.entry_slots(vis, 3).tolist() == [[1, 3, -1], [-1, -1, -1], [0, 1, 2]]


def test_attend_is_the_reference():
    """``V4Attention._attend`` (the model's torch path) is ``reference``; the dispatch without Triton is too."""
    from torchinferno.models.deepseek_v4.config import CSA, tiny_deepseek_v4_config
    from torchinferno.models.deepseek_v4.model import V4Attention

    C = _checks()
    cfg = tiny_deepseek_v4_config()
    attn = V4Attention(cfg, CSA)
    with torch.no_grad():
        attn.sinks.copy_(torch.randn(cfg.num_attention_heads))
    a, width = C.inputs(torch.device("cpu"), torch.float32, Q=11, ctx=9, H=cfg.num_attention_heads, D=cfg.head_dim,
                        W=cfg.sliding_window, kind="csa", topk=cfg.index_topk)
    a.update(sinks=attn.sinks.detach(), scale=attn.scale)
    want = spp.reference(**a)
    got = attn._attend(a["q"], a["pos"], a["keys"], a["lo"], a["ent"], a["vis"])
    assert torch.equal(got, want)
    assert torch.equal(attn._attend_sparse(a["q"], a["pos"], a["keys"], a["lo"], a["ent"], a["vis"]), want)


@pytest.mark.parametrize("check", ["kernel", "model"])
def test_sparse_sink_prefill_on_the_triton_interpreter(check, interpreter_check):
    interpreter_check("sparse_sink_prefill_checks.py", check)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_sink_prefill_cuda(dtype):
    C = _checks()
    dev = torch.device("cuda")
    C.check_kernel(dev, dtype)
    C.check_sabotage(dev, dtype)
    flash = {"H": 64, "D": 512, "W": 128}
    for kw in ({**flash, "kind": "csa", "Q": 300, "topk": 64},  # V4-Flash CSA layer, selection biting
               {**flash, "kind": "csa", "Q": 96, "ctx": 2100, "topk": 512},  # a chunk over a cached context
               {**flash, "kind": "hca", "Q": 260, "ctx": 3, "rate": 128},
               {"H": 16, "D": 128, "W": 64, "kind": "csa", "Q": 200, "topk": 64}):  # the "small" config
        got, torch_path, exact, _, _ = C.run_case(dev, dtype, **kw)
        err, err_torch = C._rel(got, exact), C._rel(torch_path, exact)
        assert err <= C.TOL[dtype], f"{kw}: rel err {err:.2e} (torch in {dtype}: {err_torch:.2e})"


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_v4_prefill_kernel_model_cuda(dtype):
    _checks().check_model(torch.device("cuda"), dtype)
