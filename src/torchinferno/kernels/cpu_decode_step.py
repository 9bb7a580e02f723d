"""The whole CPU decode step in one native call (``cpu_decode_step.c``): build once, load with ctypes.

Why: a 135M-parameter model's CPU decode step is ~30 layers x ~15 eager ops; beside the GEMVs
(which stream the weights near the memory bandwidth) the rest of the step was Python, dispatch,
allocation and one SDPA per layer that does not amortize over a batch. The C step runs every
layer for all sequences inside one OpenMP region (GEMVs split by output groups, attention by
(sequence, head)), with the GEMV tiles of ``cpu_gemv.c`` (bf16) and ``cpu_qgemv.c`` (GGUF blocks).

Availability: the CPU flags of both GEMV kernels and a working gcc; otherwise :func:`load` returns
``None`` (reason in :func:`unavailable_reason`) and the family's Python lean step runs instead.
Built on first :func:`load` into the kernel cache like the GEMVs; the included sources' hash is
part of the build flags, so a change in either GEMV file rebuilds the step.

Numerics: the .c file's header (the module path's roundings; agreement within bf16 rounding).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from torchinferno.kernels import cpu_gemv, cpu_qgemv, native_lib

SOURCE = Path(__file__).with_name("cpu_decode_step.c")
INCLUDED = (cpu_gemv.SOURCE, cpu_qgemv.SOURCE)
ABI_VERSION = 1
MAX_HEAD_DIM = 512
LIN_BF16, LIN_Q4, LIN_Q8 = 0, 4, 8

STEPS = ("native", "python")  # bench-generate's --cpu-step
_default_step = ["native"]  # what a lean CPU step built without an explicit choice uses; set by use_step()


def default_step() -> str:
    return _default_step[0]


@contextlib.contextmanager
def use_step(step: str) -> Iterator[None]:
    """Within this block, lean CPU decode steps built without an explicit choice run ``step``: "native" (this
    module's C step where it applies) or "python" (the family's eager ops). For callers that build runners
    through code they do not own (bench-generate's ``--cpu-step``, an A/B of the two)."""
    if step not in STEPS:
        from torchinferno.errors import ConfigError

        raise ConfigError(f"unknown CPU decode step '{step}' (valid: {', '.join(STEPS)})")
    old = _default_step[0]
    _default_step[0] = step
    try:
        yield
    finally:
        _default_step[0] = old


class _Linear(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int64), ("w", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("in_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("qkv", _Linear), ("o", _Linear),
                ("gate_up", _Linear), ("down", _Linear), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


class _Step(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("batch", "hidden", "heads", "kv_heads", "head_dim", "inter",
                                                    "num_layers", "block_size", "table_width", "kv_fp32", "nthreads")]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float), ("layers", ctypes.POINTER(_Layer)),
                 ("block_tables", ctypes.c_void_p), ("seq_lens", ctypes.c_void_p), ("cos", ctypes.c_void_p),
                 ("sin", ctypes.c_void_p), ("final_norm", ctypes.c_void_p), ("h", ctypes.c_void_p)]


def _cflags() -> list[str]:
    h = hashlib.sha256()
    for p in INCLUDED:
        h.update(p.read_bytes())
    flags = sorted(set(cpu_gemv.CFLAGS) | set(cpu_qgemv.CFLAGS), key=(cpu_gemv.CFLAGS + cpu_qgemv.CFLAGS).index)
    return [*flags, f"-DTI_INCLUDED_HASH={h.hexdigest()[:16]}"]


def load() -> ctypes._CFuncPtr | None:
    """The step's entry point, built on first use; ``None`` when unavailable (never raises)."""
    return _LIB.load()


def unavailable_reason() -> str:
    """Why :func:`load` returned ``None`` ("" if it did not, or was not called)."""
    return _LIB.unavailable_reason()


_LIB = native_lib.NativeLibrary(native_lib.NativeSpec(
    what="native CPU decode step (the Python lean step runs)", source=SOURCE, cflags=_cflags,
    cpu_flags=tuple(dict.fromkeys(cpu_gemv.CPU_FLAGS + cpu_qgemv.CPU_FLAGS)),
    abi_symbol="ti_decode_step_abi_version", abi_version=ABI_VERSION, entry="ti_decode_step",
    argtypes=[ctypes.POINTER(_Step)], restype=ctypes.c_int))


def linear_spec(mod) -> tuple[int, torch.Tensor, torch.Tensor | None, int, int] | None:
    """(kind, packed weight, fp32 bias or None, N, K) of a linear the step can run, else None.

    Runs a :class:`PackedLinear` on our bf16 kernel and a :class:`QuantLinear` with bf16 outputs."""
    from torchinferno.kernels.cpu_linear import PackedLinear

    if not isinstance(mod, PackedLinear):
        return None
    gemv = mod.gemv
    packed, b32 = getattr(gemv, "packed", None), getattr(gemv, "bias32", None)
    if packed is None:
        return None
    if getattr(gemv, "out_dtype", None) is not torch.bfloat16:
        return None
    if mod.kernel == "avx512bf16":
        return LIN_BF16, packed, b32, mod.out_features, mod.in_features
    fmt = cpu_qgemv.GGUF_TYPES.get(mod.kernel)
    if fmt is None:
        return None
    return (LIN_Q4 if fmt.bits == 4 else LIN_Q8), packed, b32, mod.out_features, mod.in_features


@dataclass
class LayerTensors:
    """One decoder layer as the step reads it (norm weights bf16 [D]; linears as :func:`linear_spec`)."""

    in_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: tuple
    o: tuple
    gate_up: tuple
    down: tuple


class NativeDecodeStep:
    """``(h [B, D] bf16 embeddings, cos/sin [B, hd] bf16, block_tables [B, W] int32, seq_lens [B] int32,
    kv_caches) -> h`` (in place: the final-normed hidden states).

    Built once on a model's extracted tensors (it keeps them alive); the caches are read per call, so a
    runner may pass any pool of the layout ``[num_blocks, block_size, Hkv, hd]`` (fp32 or bf16, contiguous).
    Invariant: sequence b's new token is position ``seq_lens[b] - 1``, its K/V slot given by its block table.
    """

    def __init__(self, fn, layers: list[LayerTensors], final_norm: torch.Tensor, *, heads: int, kv_heads: int,
                 head_dim: int, inter: int, eps: float, scale: float):
        self.fn = fn
        self.layers = layers
        self.final_norm = final_norm
        self.hidden = final_norm.shape[0]
        self.heads, self.kv_heads, self.head_dim, self.inter = heads, kv_heads, head_dim, inter
        self.eps, self.scale = float(eps), float(scale)
        self._structs = (_Layer * len(layers))()
        for s, lt in zip(self._structs, layers):
            s.in_norm, s.post_norm = lt.in_norm.data_ptr(), lt.post_norm.data_ptr()
            for name in ("qkv", "o", "gate_up", "down"):
                kind, w, b, n, k = getattr(lt, name)
                setattr(s, name, _Linear(kind, w.data_ptr(), None if b is None else b.data_ptr(), n, k))
        self._cache_ptrs: tuple | None = None

    @staticmethod
    def supported(kv_dtype: torch.dtype, head_dim: int) -> bool:
        return kv_dtype in (torch.float32, torch.bfloat16) and head_dim <= MAX_HEAD_DIM and head_dim % 16 == 0

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, kv_caches) -> torch.Tensor:
        k0 = kv_caches[0][0]
        ptrs = tuple(c.data_ptr() for kv in kv_caches for c in kv)
        if ptrs != self._cache_ptrs:  # a new pool (or the first call): point the layers at it
            for s, (k, v) in zip(self._structs, kv_caches):
                s.k_cache, s.v_cache = k.data_ptr(), v.data_ptr()
            self._cache_ptrs = ptrs
        st = _Step(batch=h.shape[0], hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                   head_dim=self.head_dim, inter=self.inter, num_layers=len(self.layers), block_size=k0.shape[1],
                   table_width=block_tables.shape[1], kv_fp32=int(k0.dtype == torch.float32),
                   nthreads=torch.get_num_threads(), eps=self.eps, scale=self.scale, layers=self._structs,
                   block_tables=block_tables.data_ptr(), seq_lens=seq_lens.data_ptr(), cos=cos.data_ptr(),
                   sin=sin.data_ptr(), final_norm=self.final_norm.data_ptr(), h=h.data_ptr())
        rc = self.fn(ctypes.byref(st))
        if rc:
            raise MemoryError(f"native CPU decode step failed (code {rc})")
        return h
