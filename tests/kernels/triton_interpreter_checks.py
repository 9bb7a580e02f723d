"""Run by tests/kernels/test_triton_interpreter.py in a subprocess with ``TRITON_INTERPRET=1``: the Triton
kernels of a decode step and a layer, executed by Triton's CPU interpreter against the same torch references as
on CUDA.

Not a pytest module (the interpreter must be switched on before Triton compiles anything, so it gets its own
process). The interpreter has no bf16 (numpy rounds it by truncation), so the checks run in fp32 and fp16.
Four things are patched here, in this process only: the Triton dispatch accepts CPU tensors
(``kernels.triton.usable``), the interpreter reads one-element loop bounds with numpy 2 (it calls
``int()`` on a 1-d array, which numpy 2 refuses), it lists each language module's builtins once instead of on
every launch (``inspect.getmembers`` per launch was ~20% of a model check's time: a decode runs thousands of launches),
and a device-function call inside a launch does not patch the language again (:func:`_patch_lang`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402

_patch_tensor = interp._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


interp._patch_lang_tensor = _patch_lang_tensor

_BUILTINS: dict[object, list] = {}  # package -> its (name, member) builtins, listed while unpatched


def _patch_builtin(pkg, builder, scope):
    """Triton's ``_patch_builtin`` with the members listed once per package: each launch patches the language
    modules and restores them afterwards, so the unpatched builtins are the same at every launch."""
    import inspect

    members = _BUILTINS.get(pkg)
    if members is None:
        members = _BUILTINS[pkg] = [(n, m) for n, m in inspect.getmembers(pkg) if interp.tl.core.is_builtin(m)]
    for name, member in members:
        interp._patch_attr(pkg, name, member, builder, scope)


_real_patch_lang = interp._patch_lang
_PATCHED: set[int] = set()  # ids of the language modules a running launch has patched


class _Scope:
    """A launch's patch scope: restoring it also forgets its modules in ``_PATCHED``."""

    def __init__(self, scope, ids: set[int]):
        self.scope, self.ids = scope, ids

    def restore(self) -> None:
        self.scope.restore()
        _PATCHED.difference_update(self.ids)


def _patch_lang(fn):
    """Triton's ``_patch_lang``, skipped for a device-function call inside a launch whose language modules that
    launch has patched already (Triton re-patches every builtin at each such call and never restores it: a kernel
    calling helpers in a loop spent ~30% of its interpreted time there)."""
    import inspect

    langs = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (interp.tl, interp.tl.core)}
    if langs and langs <= _PATCHED:
        return interp._LangPatchScope()  # nothing to restore
    scope = _real_patch_lang(fn)
    new = langs - _PATCHED
    _PATCHED.update(new)
    return _Scope(scope, new)


if all(hasattr(interp, n) for n in ("_patch_attr", "_patch_builtin", "_patch_lang", "_LangPatchScope")):
    interp._patch_builtin = _patch_builtin  # the Triton versions this was written for (3.5-3.6)
    interp._patch_lang = _patch_lang

import torchinferno.kernels.triton as tri  # noqa: E402

tri.usable = lambda t: not tri._tracing()  # CPU tensors take the Triton path (run by the interpreter)

CPU = torch.device("cpu")


def decode_attention() -> None:
    import test_triton_kernels as T

    for dtype in (torch.float32, torch.float16):
        for splits in (None, 1, 4):
            T.check_decode(CPU, dtype, num_splits=splits)
            T.check_decode(CPU, dtype, num_splits=splits, merge=True)
    for splits in (1, 4, 16):  # empty sequences and splits past the end, skipped by the in-kernel merge
        T.check_decode(CPU, torch.float32, lens=(0, 1, 63, 64, 65), num_splits=splits, merge=True)
    T.check_decode(CPU, torch.float16, lens=(5, 700), H=8, Hkv=1, D=576, DV=512, merge=True)  # MLA latent layout


def decode_gemv() -> None:
    import test_decode_gemv as G

    G.DT = torch.float16
    for case in G.CASES_PLAIN[:3]:
        G.check_plain(CPU, *case)
    G.check_swiglu(CPU, 384, 256)
    G.check_two_weights(CPU, 96, 36, 320, config={"block_n": 8, "block_k": 128})  # rows of two weights, one launch
    for case in G.CASES_ROPE:
        G.check_rope_kv(CPU, *case)


def fused_step() -> None:
    """The fused CUDA step (its kernels interpreted) vs the module path, fp32, and its one-row head."""
    import test_cuda_decode_step as S

    from torchinferno.models.common.step_model import LeanStepModel
    from torchinferno.models.llama3 import cuda_decode

    cuda_decode.CudaDecodeStep.supports = staticmethod(lambda model: True)  # it would refuse CPU weights
    model = S._model(CPU, torch.float32)
    spec = model.family.kv_spec(model.config)
    prompt = [5, 17, 99, 3, 42, 7, 8]
    want = S._decode_hidden(model, spec.allocate(8, 4, torch.float32, CPU), prompt, 5)
    fused = LeanStepModel(model, cuda_decode.CudaDecodeStep(model, pdl=False))
    got = S._decode_hidden(fused, spec.allocate(8, 4, torch.float32, CPU), prompt, 5)
    rel = float((got - want).norm() / want.norm())
    assert rel < 1e-5, rel
    h = torch.randn(1, model.config.hidden_size)
    assert fused.step.compute_logits(h) is not None  # the step's head runs, not the model's fallback
    with torch.no_grad():
        ref = torch.nn.functional.linear(h, model.head_weight())
        rel = float((fused.compute_logits(h) - ref).norm() / ref.norm())
    assert rel < 1e-5, rel


def layer_kernels() -> None:
    """RMSNorm (+ residual), SwiGLU, rotary, KV append and the paged prefill attention."""
    import test_triton_kernels as T

    for dtype in (torch.float32, torch.float16):
        T.check_rms_norm(CPU, dtype)
        T.check_swiglu(CPU, dtype)
        T.check_rotary(CPU, dtype)
        T.check_kv_append(CPU, dtype)
    T.check_prefill(CPU, torch.float32)


def mixed_graphs() -> None:
    """The whole-step runner's graph-padded attention (one varlen launch over a grid fixed by the padded shapes) vs
    the model's own Triton paths, through a tiny llama in fp32 and fp16 (test_cuda_graphs_mixed.py); and the kernel
    alone, with decode rows on their own rows and on whole tiles: live rows == the torch reference, rows of no
    sequence zero."""
    import test_cuda_graphs_mixed as M
    from graph_test_models import mixed_step

    from torchinferno.kernels import api as kapi
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    for dtype in (torch.float32, torch.float16):
        M.check_whole_step_runner(CPU, dtype, TritonPagedAttention, capture=False)
    g = torch.Generator().manual_seed(3)
    H, Hkv, D, BS, NB, T = 4, 2, 16, 4, 32, 16
    kc, vc = torch.randn(NB, BS, Hkv, D, generator=g), torch.randn(NB, BS, Hkv, D, generator=g)
    _, _, meta = mixed_step(g, 8, CPU, [(6, 1), (0, 5), (9, 1), (3, 4)], BS, NB)  # 11 live rows in 4 sequences
    n, B, w = 11, 4, meta.block_tables.shape[1]
    q = torch.randn(T, H, D, generator=g)
    qsl = torch.full((T + 1,), n, dtype=torch.int32)
    qsl[: B + 1] = meta.query_start_loc
    lens = torch.zeros(T, dtype=torch.int32)
    lens[:B] = meta.seq_lens
    bt = torch.randint(0, NB, (T, w + 3), generator=g, dtype=torch.int32)  # stale rows and columns past the step's
    bt[:B, :w] = meta.block_tables
    want = kapi.paged_attention_reference(q[:n], kc, vc, meta.query_lens_list, meta.seq_lens_list,
                                          meta.block_tables, 0.25)
    for decode_rows in (True, False):  # a decode row on its heads' rows, or on a whole query tile
        got = kapi.graph_padded_attention(q, kc, vc, qsl, lens, bt, 0.25, decode_rows)
        torch.testing.assert_close(got[:n], want, rtol=1e-4, atol=1e-4)
        assert got[n:].eq(0).all()


def run_checks(checks: dict, argv: list[str] | None = None) -> None:
    """A check script's ``main``: run the check named by ``argv[1]`` (``checks``: name -> callable taking the CPU
    device) under these patches and print ``ok NAME``; an unknown name is a KeyError."""
    what = (argv or sys.argv)[1]
    checks[what](CPU)
    print(f"ok {what}", flush=True)


CHECKS = {"decode_attention": decode_attention, "decode_gemv": decode_gemv, "fused_step": fused_step,
          "layer_kernels": layer_kernels, "mixed_graphs": mixed_graphs}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(CHECKS):
        CHECKS[name]()
        print(f"ok {name}", flush=True)
