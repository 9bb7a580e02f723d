"""V3.2's sparse DSA decode kernel (the sparse-sink kernel with values the first ``dv`` of each latent row, no sink)
against its torch reference and the dense path (checks in dsa_sparse_decode_checks.py).

Interpreter (``TRITON_INTERPRET=1`` subprocess, CPU): kernel == reference, sparse absorbed == dense keep-mask; the
tiny V3.2 v1 (fused ops, Triton pieces on) decoding sparse == v0 decoding dense. CUDA (skipped without): the same at
fp32 / bf16 and V3.2's attention shape (128 heads, 512 + 64 latent, top-k 2048), and decoding from CUDA graphs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def test_dsa_sparse_kernel_on_the_triton_interpreter(interpreter_check):
    interpreter_check("dsa_sparse_decode_checks.py", "kernel")


@pytest.mark.slow  # ~25 s: the whole tiny model under the interpreter
def test_dsa_sparse_model_on_the_triton_interpreter(interpreter_check):
    interpreter_check("dsa_sparse_decode_checks.py", "model")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _checks():
    sys.path[:0] = [str(HERE), str(HERE.parent / "models")]
    import dsa_sparse_decode_checks as C

    return C


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dsa_sparse_kernel_cuda(dtype):
    C = _checks()
    dev = torch.device("cuda")
    C.check_kernel(dev, dtype)
    for kw in ({"B": 4, "H": 128, "R": 512, "r": 64, "k": 2048, "blocks": 256, "bs": 64},  # V3.2 decode layer
               {"B": 1, "H": 16, "R": 512, "r": 64, "k": 2048, "blocks": 64, "bs": 64},  # one row: split-K
               {"B": 8, "H": 16, "R": 512, "r": 64, "k": 300, "blocks": 32, "bs": 16}):
        got, want = C.case(dev, dtype, **kw)
        err = C._rel(got, want)
        assert err <= C.TOL[dtype], f"{kw}: rel err {err:.2e}"


@pytest.mark.cuda
@needs_cuda
def test_dsa_sparse_model_cuda():
    _checks().check_model(torch.device("cuda"))


@pytest.mark.cuda
@needs_cuda
def test_v32_dsa_llm_cuda_graphs_equal_dense_eager():
    """Through the engine: graph-replayed sparse DSA decode (fp32, top-k 8) gives the eager dense decode's tokens."""
    sys.path[:0] = [str(HERE.parent / "models")]
    from dataclasses import replace

    import test_deepseek_dsa_sparse as M

    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm import LLM
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config

    model = M.make(replace(tiny_deepseek_v32_config(), index_topk=8), sparse=True, variant="v1").cuda()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 9, 17, 30)]
    p = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    kw = dict(block_size=4, num_gpu_blocks=128, max_model_len=128, max_num_seqs=4, enable_prefix_caching=False)
    llm = LLM(model, **kw)
    got = [o.token_ids for o in llm.generate(prompts, p, use_tqdm=False)]
    assert llm.engine.stats().num_graph_steps > 0
    del llm
    M.set_sparse(model, False)
    want = [o.token_ids for o in LLM(model, enforce_eager=True, **kw).generate(prompts, p, use_tqdm=False)]
    assert got == want
