"""DeepSeek-V4's sparse-sink decode kernel (kernels/triton/sparse_sink_decode.py) against its torch reference, and the
V4 model decoding through it (checks in sparse_sink_decode_checks.py).

Interpreter (``TRITON_INTERPRET=1`` subprocess, CPU): kernel == reference over several shapes, masked rows, zero
entries; the tiny V4 v1 static decode with every Triton piece on == the eager decode. CUDA (skipped without): the
same at fp32 / bf16 and V4-Flash's attention shape (64 heads of 512), and the model decoding from captured graphs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("check", ["kernel", "model"])
def test_sparse_sink_decode_on_the_triton_interpreter(check, interpreter_check):
    interpreter_check("sparse_sink_decode_checks.py", check)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _checks():
    sys.path[:0] = [str(HERE), str(HERE.parent / "models")]
    import sparse_sink_decode_checks as C

    return C


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_sink_decode_cuda(dtype):
    C = _checks()
    dev = torch.device("cuda")
    C.check_kernel(dev, dtype)
    for kw in ({"B": 4, "H": 64, "D": 512, "W": 128, "K": 512, "blocks": 64, "bs": 64},  # V4-Flash CSA layer
               {"B": 8, "H": 16, "D": 128, "W": 64, "K": 64, "blocks": 32, "bs": 16}):  # the "small" config
        got, want = C.case(dev, dtype, **kw)
        err = C._rel(got, want)
        assert err <= C.TOL[dtype], f"{kw}: rel err {err:.2e}"


@cuda
def test_v4_decodes_from_cuda_graphs():
    sys.path[:0] = [str(HERE.parent / "models")]
    import test_deepseek_v4_decode as M

    from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
    from torchinferno.models.deepseek_v4.model import randomize_untrained_
    from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

    torch.manual_seed(0)
    model = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=3).cuda()
    want, _ = M.run(model, static=False)
    got, _ = M.run(model, static=True, mode="runner")
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@cuda
def test_v4_llm_cuda_graphs_equal_eager():
    """Through the engine: the graph-replayed static decode (fp32) gives the eager per-sequence decode's tokens."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm import LLM
    from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
    from torchinferno.models.deepseek_v4.model import V4Attention, randomize_untrained_
    from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

    torch.manual_seed(0)
    model = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=3).cuda()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 9, 17, 30)]
    p = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    kw = dict(block_size=4, num_gpu_blocks=128, max_model_len=128, max_num_seqs=4, enable_prefix_caching=False)
    llm = LLM(model, **kw)
    got = [o.token_ids for o in llm.generate(prompts, p, use_tqdm=False)]
    assert llm.engine.stats().num_graph_steps > 0
    del llm
    for a in model.modules():
        if isinstance(a, V4Attention):
            a.static_decode = False
    want = [o.token_ids for o in LLM(model, enforce_eager=True, **kw).generate(prompts, p, use_tqdm=False)]
    assert got == want
