"""Our AVX512-BF16 CPU GEMV (kernels/cpu_gemv.c) vs float64 and oneDNN; build cache; kernel choice.

Skips cleanly where the CPU lacks avx512_bf16 or gcc cannot build the kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.kernels import cpu_gemv
from torchinferno.kernels.cpu_linear import MIN_ROWS, PackedLinear, can_prepack, prepack_linears
from torchinferno.testing import tiny_model

SHAPES = [(960, 576), (37, 19), (64, 2), (16, 1), (100, 33), (1000, 130)]  # (N, K): N off 16/64 grids, odd K


@pytest.fixture(scope="module")
def fn():
    f = cpu_gemv.load()
    if f is None:
        pytest.skip(f"avx512bf16 GEMV unavailable: {cpu_gemv.unavailable_reason()}")
    return f


def _data(n: int, k: int, m: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g).to(torch.bfloat16), torch.randn(m, k, generator=g).to(torch.bfloat16)


def _gemv(fn, w: torch.Tensor, bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16):
    return cpu_gemv.make_gemv(fn, cpu_gemv.pack_weight(w), w.shape[0], w.shape[1], bias, out_dtype)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", range(1, 10))
def test_matches_float64_within_fp32_accumulation(fn, n, k, m):
    w, x = _data(n, k, m)
    y32 = _gemv(fn, w, out_dtype=torch.float32)(x)
    ref = x.double() @ w.double().T  # the bf16 inputs, exactly
    bound = 2 * k * 2.0**-24 * (x.double().abs() @ w.double().abs().T) + 1e-30  # k fp32 additions
    assert ((y32.double() - ref).abs() <= bound).all()
    # bf16 output is the fp32 accumulator rounded once (RNE)
    assert torch.equal(_gemv(fn, w)(x), y32.to(torch.bfloat16))


@pytest.mark.skipif(not can_prepack(torch.bfloat16), reason="oneDNN bf16 not supported on this CPU")
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_onednn_within_bf16_rounding(fn, n, k):
    w, x = _data(n, k, 5)
    ours = _gemv(fn, w)(x).float()
    onednn = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 1), None, "none", [], "")
    scale = (x.float().abs() @ w.float().abs().T)
    assert ((ours - onednn.float()).abs() <= 2.0**-7 * scale + 1e-6).all()


def test_bias_added_in_fp32_before_rounding(fn):
    w, x = _data(100, 33, 3)
    b = torch.randn(100, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y32 = _gemv(fn, w, out_dtype=torch.float32)(x)
    assert torch.equal(_gemv(fn, w, b)(x), (y32 + b.float()).to(torch.bfloat16))


@pytest.mark.parametrize("n,k,m", [(1000, 130, 9), (200, 301, 13)])  # k-chunked two-tile groups at 7-12 rows
def test_rows_independent_of_m_and_other_rows(fn, n, k, m):
    w, x = _data(n, k, m)
    gemv = _gemv(fn, w)
    full = gemv(x)
    other = torch.randn(m, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    for i in range(m):
        assert torch.equal(gemv(x[i:i + 1]), full[i:i + 1])
        mixed = other.clone()
        mixed[i] = x[i]
        assert torch.equal(gemv(mixed[: i + 1])[i], full[i])


def test_multi_thread_bitwise_single_thread(fn):
    w, x = _data(1000, 130, 6)
    gemv = _gemv(fn, w)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemv(x)
        torch.set_num_threads(max(2, n))
        many = gemv(x)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, many)


def test_strided_rows_and_input_checks(fn):
    w, x = _data(100, 33, 4)
    wide = torch.zeros(4, 50, dtype=torch.bfloat16)
    wide[:, 7:40] = x
    gemv = _gemv(fn, w)
    assert torch.equal(gemv(wide[:, 7:40]), gemv(x))  # row stride 50, last dim contiguous
    assert torch.equal(gemv(x.T.contiguous().T), gemv(x))  # column-major: copied
    with pytest.raises(TypeError, match="bf16"):
        gemv(x.float())
    assert gemv(x[:0]).shape == (0, 100)


def test_build_cache_is_reused(tmp_path: Path):
    import shutil

    if shutil.which("gcc") is None or not cpu_gemv.cpu_supported()[0]:
        pytest.skip("needs gcc and an avx512_bf16 CPU")
    path, built = cpu_gemv.build(tmp_path)
    assert built and path.exists() and path.parent == tmp_path / "kernels"
    mtime = path.stat().st_mtime_ns
    path2, built2 = cpu_gemv.build(tmp_path)
    assert path2 == path and not built2 and path.stat().st_mtime_ns == mtime
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left


def test_one_openmp_runtime(fn):
    _gemv(fn, *_data(1000, 130, 0)[:1])(torch.ones(2, 130, dtype=torch.bfloat16))
    maps = Path("/proc/self/maps").read_text().splitlines()
    gomps = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(gomps) <= 1, gomps  # our .so bound to the libgomp torch loaded, not a second copy


@pytest.mark.skipif(not can_prepack(torch.bfloat16), reason="oneDNN bf16 not supported on this CPU")
def test_kernel_choice_and_onednn_fallback(fn):
    w, x = _data(100, 33, 3)
    ours, onednn = PackedLinear(w, kernel="avx512bf16"), PackedLinear(w, kernel="onednn")
    assert (ours.kernel, ours.min_rows) == ("avx512bf16", 1)
    assert (onednn.kernel, onednn.min_rows) == ("onednn", MIN_ROWS)
    assert PackedLinear(w).kernel == "avx512bf16"  # auto, where available
    torch.testing.assert_close(ours(x).float(), onednn(x).float(), atol=3e-2, rtol=2e-2)
    model = tiny_model("llama3", dtype=torch.bfloat16)
    prepack_linears(model, kernel="onednn")
    assert {m.kernel for m in model.modules() if isinstance(m, PackedLinear)} == {"onednn"}


def test_bad_kernel_name_lists_valid_values():
    with pytest.raises(ConfigError, match="valid: auto, onednn, avx512bf16"):
        prepack_linears(tiny_model("llama3"), kernel="mkl")


@pytest.mark.skipif(not can_prepack(torch.bfloat16), reason="oneDNN bf16 not supported on this CPU")
def test_unavailable_kernel(monkeypatch):
    from torchinferno.kernels.native_lib import NativeLibrary

    monkeypatch.setattr(cpu_gemv, "_LIB", NativeLibrary.unavailable(cpu_gemv._LIB.spec, "CPU lacks avx512_bf16"))
    w = torch.randn(32, 16).to(torch.bfloat16)
    assert PackedLinear(w).kernel == "onednn"  # auto falls back
    with pytest.raises(ConfigError, match="avx512bf16 is unavailable here .CPU lacks avx512_bf16"):
        PackedLinear(w, kernel="avx512bf16")


def test_amx_path_keeps_the_invariants(fn):
    """Opt-in AMX tiles (where the CPU has them): within fp32 accumulation of float64, rows independent of M,
    multi-thread == one thread; off again afterwards (the default path)."""
    if not cpu_gemv.set_amx(True):
        cpu_gemv.set_amx(False)
        pytest.skip("no AMX on this CPU")
    try:
        w, x = _data(1000, 576, 19)  # K % 32 == 0: the AMX path; 19 rows: a 16-row tile and a 3-row one
        y32 = _gemv(fn, w, out_dtype=torch.float32)(x)
        ref = x.double() @ w.double().T
        bound = 2 * 576 * 2.0**-24 * (x.double().abs() @ w.double().abs().T) + 1e-30
        assert ((y32.double() - ref).abs() <= bound).all()
        gemv = _gemv(fn, w)
        full = gemv(x)
        for i in (0, 7, 18):
            assert torch.equal(gemv(x[i:i + 1]), full[i:i + 1])
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = gemv(x)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(one, full)
    finally:
        assert cpu_gemv.set_amx(False) is False


def test_amx_kernel_choice_is_scoped_and_refused_where_missing():
    """``--cpu-gemv amx``: avx512bf16's packing with AMX allowed inside ``amx_allowed`` only (the default, off, comes
    back after it, also when the block raises); a machine without AMX refuses it in one line naming the choices."""
    from torchinferno.errors import ConfigError
    from torchinferno.kernels.cpu_linear import resolve_kernel

    if not cpu_gemv.amx_available():
        with pytest.raises(ConfigError, match="amx.*use auto"):
            resolve_kernel("amx")
        return
    assert resolve_kernel("amx") == "avx512bf16"
    with pytest.raises(RuntimeError):
        with cpu_gemv.amx_allowed() as on:
            assert on and cpu_gemv.set_amx(True)  # still allowed inside
            raise RuntimeError("the block fails")
    assert cpu_gemv._amx_requested == [False]
    with cpu_gemv.amx_allowed(False) as on:
        assert on is False
