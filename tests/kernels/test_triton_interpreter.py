"""The decode-step Triton kernels on Triton's CPU interpreter, against the torch references (no GPU needed).

Each check runs ``tests/kernels/triton_interpreter_checks.py`` in its own process with ``TRITON_INTERPRET=1``
(the interpreter must be on before Triton sees a kernel): decode attention (splits, in-kernel merge, empty
sequences, MLA layout), the fused decode GEMVs (norm prologue, residual, SwiGLU, rotary + K/V store), the
fused CUDA step vs the module path, the layer kernels (RMSNorm, SwiGLU, rotary, KV append, prefill attention) and the whole-step graph runner's
padded attention (``kernels.cuda_graphs_mixed``). fp32/fp16 only: the interpreter has no bf16. PDL and FP8 need a GPU
(test_triton_kernels.py, test_decode_gemv.py, test_cuda_decode_step.py on CUDA; test_triton_compile.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parent / "triton_interpreter_checks.py"


@pytest.mark.parametrize("check", ["decode_attention", "decode_gemv", "fused_step", "layer_kernels", "mixed_graphs"])
def test_triton_kernels_on_the_interpreter(check, interpreter_check):
    interpreter_check(SCRIPT.name, check)
