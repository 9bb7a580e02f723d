"""Block-scaled FP8 (E4M3) linears: DeepSeek-V3's released weight format, multiplied natively (W8A8, 128x128 blocks).

The recipe (DeepSeek-V3's ``fp8_gemm``, DeepGEMM, vLLM's ``w8a8_block_fp8_matmul``):

* weight ``W_q [N, K]`` ``float8_e4m3fn`` with ``scale_inv [ceil(N/128), ceil(K/128)]`` fp32, one per 128x128 block
  (edge blocks partial): ``W ~= W_q * scale_inv[n // 128, k // 128]`` (``checkpoint.fp8``'s formula);
* activation ``x [M, K]`` quantized at every call per token and 128-wide K group:
  ``s_x[m, g] = max(amax(|x[m, g*128:(g+1)*128]|), EPS) * fp32(1/448)``, ``x_q = rne(clamp(x / s_x, +-448))``;
* ``y[m, n] = sum_g (x_q[m, g] . W_q[n, g]) * s_x[m, g] * s_w[n // 128, g]``, each group's partial product and the
  sum in fp32 (groups in ascending order), ``+ bias`` in fp32, rounded once to the activation dtype.

Invariant: :func:`fp8_block_linear_reference` (plain torch, any device) is the definition; the Triton kernel
(``kernels.triton.fp8_block``, CUDA sm89+) quantizes the activation bitwise as :func:`quantize_fp8_groups` does and
differs only in the summation order inside one group (and Hopper's FP8 MMA accumulation within a group).

``--quantization fp8-block`` (``kernels.fp8_block_model.quantize_model_fp8_block``): every exact ``nn.Linear`` but the
logits head and the routed experts (``kernels.fp8_block_moe``) become block FP8 — the checkpoint's own FP8 blocks
where it has them (``kernels.fp8_block_load``: kept bitwise), else the loaded weights quantized to 128x128 blocks.
``kernels.fp8_block_stream`` applies the same swaps one decoder layer at a time while a model is built or loaded
(DeepSeek checkpoints through ``engine.assembly.build_model``): the same tensors, never the whole model in float.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.kernels.fp8_rule import E4M3_MAX, EPS, INV_E4M3_MAX  # noqa: F401  (the shared rule, re-exported)
from torchinferno.kernels.module_swap import replace_linears

GROUP = 128
FP8_BLOCK_KERNELS = ("auto", "torch", "triton")

__all__ = ["quantize_fp8_groups", "quantize_weight_blocks", "dequantize_weight_blocks", "fp8_block_linear_reference",
           "Fp8BlockLinear", "swap_linear_for_fp8_block", "block_config", "BlockConfig", "triton_supported",
           "FP8_BLOCK_KERNELS"]


def quantize_fp8_groups(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` -> ``(q [..., K] float8_e4m3fn, s [..., ceil(K/group)] fp32)``, ``x ~= q * s`` per group.

    A partial last group is scaled by its own elements; an all-zero group gets ``EPS / 448`` and zeros."""
    K = x.shape[-1]
    G = -(-K // group)
    xf = x.float()
    if G * group != K:
        xf = torch.nn.functional.pad(xf, (0, G * group - K))
    xg = xf.view(*x.shape[:-1], G, group)
    s = xg.abs().amax(dim=-1).clamp_min(EPS) * INV_E4M3_MAX  # [..., G]
    q = (xg / s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(*x.shape[:-1], G * group)[..., :K], s


def quantize_weight_blocks(w: torch.Tensor, block: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight ``[N, K]`` -> ``(W_q [N, K] e4m3, scale_inv [ceil(N/128), ceil(K/128)] fp32)``: per block
    ``scale_inv = max(amax, EPS) * fp32(1/448)``, ``W_q = rne(clamp(W / scale_inv, +-448))`` (the activation rule
    over 128x128 tiles; ``checkpoint.fp8.quantize_fp8_block`` divides by 448 instead, within one fp32 ulp)."""
    N, K = w.shape
    sn, sk = -(-N // block), -(-K // block)
    pad = torch.zeros(sn * block, sk * block, dtype=torch.float32, device=w.device)
    pad[:N, :K] = w.float()
    tiles = pad.view(sn, block, sk, block)
    s = tiles.abs().amax(dim=(1, 3)).clamp_min(EPS) * INV_E4M3_MAX  # [sn, sk]
    q = (tiles / s[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(sn * block, sk * block)[:N, :K].contiguous(), s


def dequantize_weight_blocks(wq: torch.Tensor, s: torch.Tensor, dtype: torch.dtype = torch.float32,
                             block: int = GROUP) -> torch.Tensor:
    """``W_q [..., N, K]``, ``s [..., ceil(N/128), ceil(K/128)]`` -> ``W_q * s`` broadcast over blocks (fp32 math)."""
    N, K = wq.shape[-2:]
    full = s.float().repeat_interleave(block, -2)[..., :N, :].repeat_interleave(block, -1)[..., :K]
    return (wq.float() * full).to(dtype)


def fp8_block_linear_reference(x: torch.Tensor, weight_fp8: torch.Tensor, scale_inv: torch.Tensor,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """The definition: ``x [..., K]``, ``weight_fp8 [N, K]``, ``scale_inv [ceil(N/128), ceil(K/128)]`` -> ``[..., N]``
    in x's dtype (module docstring). One fp32 matmul per K group (memory stays ``O(M N)``)."""
    N, K = weight_fp8.shape
    xq, xs = quantize_fp8_groups(x.reshape(-1, K))  # [M, K], [M, G]
    ws = scale_inv.float().repeat_interleave(GROUP, 0)[:N]  # [N, G]: the scale row of each output column
    w = weight_fp8.float()
    y = torch.zeros(xq.shape[0], N, dtype=torch.float32, device=x.device)
    for g in range(xs.shape[1]):
        ks = slice(g * GROUP, min(K, (g + 1) * GROUP))
        y += (xq[:, ks].float() @ w[:, ks].t()) * xs[:, g : g + 1] * ws[:, g]
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], N)


def triton_supported(device: torch.device | str) -> bool:
    """The Triton kernel applies: a CUDA device with FP8 tensor cores (compute capability >= 8.9), Triton present."""
    from torchinferno.kernels import triton as tri

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available() or not tri.available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """Tiles of the block-FP8 GEMM (``BLOCK_K`` is the scale group, 128)."""

    BLOCK_M: int
    BLOCK_N: int
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 3


# rows M (at most) -> tiles; the first entry whose bound is >= M applies. Untuned defaults (vLLM's block-FP8 defaults
# are BLOCK_M 64, BLOCK_N 128, GROUP_M 32, 4 warps, 3 stages); benchmarks/probe_fp8_block.py sweeps them per shape.
M_TILES: tuple[tuple[int, BlockConfig], ...] = (
    (16, BlockConfig(16, 64, 1, 4, 4)),
    (64, BlockConfig(32, 64, 8, 4, 4)),
    (256, BlockConfig(64, 128, 8, 4, 3)),
    (1 << 62, BlockConfig(128, 128, 8, 8, 3)),
)
MIN_PROGRAMS = 132  # narrower N tiles for small M until the grid covers a GPU's SMs once (H100/H200: 132)
# split-K for decode-sized M (<= SPLIT_K_MAX_M rows): the K groups shared among programs until about four waves of
# SMs stream the weight, each share at least SPLIT_K_MIN_GROUPS groups. Run 47 (H100): at M=1 the unsplit GEMM of
# V3-shape layers took 1.95 of a 4.31 ms step, 4.6-5.2x the time of its ~1.1-1.2 GB of FP8 weights at the copy
# bandwidth (the bytes counted from the config; o_proj: 224 programs, each walking all 128 K groups). Untuned: benchmarks/probe_fp8_block.py measures it.
SPLIT_K_MAX_M = 64
SPLIT_K_PROGRAMS = 4 * 132
SPLIT_K_MIN_GROUPS = 4


def block_config(M: int, N: int, K: int, table: tuple[tuple[int, BlockConfig], ...] = M_TILES) -> dict:
    """Tiles for an ``[M, K] x [K, N]`` block-FP8 GEMM: :data:`M_TILES`' row for ``M``, its ``BLOCK_N`` halved
    (down to 16) while the grid has fewer than :data:`MIN_PROGRAMS` programs (decode: a weight stream), and
    ``SPLIT_K`` (a power of two) for up to :data:`SPLIT_K_MAX_M` rows while the grid has fewer than
    :data:`SPLIT_K_PROGRAMS` programs and each share keeps :data:`SPLIT_K_MIN_GROUPS` K groups."""
    cfg = next(c for bound, c in table if M <= bound)
    bn = cfg.BLOCK_N
    while bn > 16 and -(-M // cfg.BLOCK_M) * -(-N // bn) < MIN_PROGRAMS:
        bn //= 2
    tiles, groups, split = -(-M // cfg.BLOCK_M) * -(-N // bn), -(-K // GROUP), 1
    while M <= SPLIT_K_MAX_M and tiles * split < SPLIT_K_PROGRAMS and groups // (2 * split) >= SPLIT_K_MIN_GROUPS:
        split *= 2
    return dict(dataclasses.asdict(cfg), BLOCK_N=bn, SPLIT_K=split)


class Fp8BlockLinear(nn.Module):
    """Drop-in for ``nn.Linear`` holding a block-scaled FP8 weight (buffers, inference only). x [..., K] -> [..., N].

    ``kernel``: ``"triton"`` (CUDA sm89+: the Triton quantizer + block GEMM), ``"torch"`` (the reference, any
    device), ``"auto"`` = ``triton`` where supported, else ``torch``. Any ``N`` and ``K`` (edge blocks partial).
    ``config``: fixed tiles for every call (a dict like :func:`block_config`'s); None = :func:`block_config` per M.
    At most :attr:`fuse_quant_rows` rows (none by default) the GEMM quantizes the activation itself (same codes).
    """

    # rows up to which the GEMM quantizes the activation itself instead of a separate quantizer launch; 0 = always
    # the separate launch. Measured (run 52, H100, probe_fp8_block.py micro, split-K tiles): the in-GEMM quantizer
    # sits in every program's K loop and doubled the GEMM at M = 1 and 16 (V3 o_proj 105 us against 2.4 us of
    # quantizer + 51.7 us of GEMM; V2-Lite down 44 against 22), so decode takes the separate launch too.
    fuse_quant_rows = 0

    def __init__(self, weight_fp8: torch.Tensor, scale_inv: torch.Tensor, bias: torch.Tensor | None = None,
                 kernel: str = "auto", config: dict | None = None):
        super().__init__()
        if kernel not in FP8_BLOCK_KERNELS:
            raise ConfigError(f"unknown FP8 block kernel {kernel!r}; valid: {', '.join(FP8_BLOCK_KERNELS)}")
        if weight_fp8.dtype != torch.float8_e4m3fn or weight_fp8.dim() != 2:
            raise ConfigError(f"Fp8BlockLinear needs a 2-D float8_e4m3fn weight, got {weight_fp8.dtype} "
                              f"{list(weight_fp8.shape)}")
        self.out_features, self.in_features = weight_fp8.shape
        want = (-(-self.out_features // GROUP), -(-self.in_features // GROUP))
        if tuple(scale_inv.shape) != want:
            raise ConfigError(f"block scales of shape {list(scale_inv.shape)} do not fit a weight "
                              f"[{self.out_features}, {self.in_features}] of 128x128 blocks (need {list(want)})")
        self.register_buffer("weight_fp8", weight_fp8.contiguous())  # [N, K] float8_e4m3fn
        self.register_buffer("weight_scale_inv", scale_inv.float().contiguous())  # [ceil(N/128), ceil(K/128)] fp32
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        if kernel == "triton" and not triton_supported(weight_fp8.device):
            raise ConfigError(f"FP8 block kernel 'triton' needs a CUDA device of compute capability >= 8.9 with "
                              f"Triton (device {weight_fp8.device}); valid here: torch, auto")
        if kernel == "auto":
            kernel = "triton" if triton_supported(weight_fp8.device) else "torch"
        self.kernel = kernel
        self.config = config

    @classmethod
    def from_linear(cls, lin: nn.Linear, kernel: str = "auto") -> "Fp8BlockLinear":
        wq, s = quantize_weight_blocks(lin.weight.detach())
        return cls(wq, s, lin.bias, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "torch":
            return fp8_block_linear_reference(x, self.weight_fp8, self.weight_scale_inv, self.bias)
        from torchinferno.kernels.triton.fp8_block import fp8_block_matmul, quantize_fp8_groups_triton

        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        cfg = self.config or block_config(x2.shape[0], self.out_features, self.in_features)
        if x2.shape[0] <= self.fuse_quant_rows:  # the GEMM quantizes its rows itself (one launch)
            y = fp8_block_matmul(x2, None, self.weight_fp8, self.weight_scale_inv, x.dtype, cfg, self.bias)
        else:
            xq, xs = quantize_fp8_groups_triton(x2)  # [M, K] e4m3, [M, G] fp32
            y = fp8_block_matmul(xq, xs, self.weight_fp8, self.weight_scale_inv, x.dtype, cfg, self.bias)
        return y.view(*shape[:-1], self.out_features)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight this module multiplies by, ``[N, K]`` in ``dtype`` (tests, accuracy reports)."""
        return dequantize_weight_blocks(self.weight_fp8, self.weight_scale_inv, dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3 128x128 blocks, "
                f"kernel={self.kernel}")


def swap_linear_for_fp8_block(model: nn.Module, skip: tuple[str, ...] = ("lm_head",), kernel: str = "auto",
                              kept: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[str]:
    """Replace every exact ``nn.Linear`` whose qualified name does not end with one of ``skip`` by an
    :class:`Fp8BlockLinear` (in place; the float weight is released). ``kept``: qualified module name ->
    ``(weight_fp8, scale_inv)`` used as they are (a checkpoint's own blocks), entries popped as used; other linears
    are quantized from their loaded weight. Returns the names swapped."""
    kept = {} if kept is None else kept

    def make(name: str, lin: nn.Linear) -> nn.Module | None:
        if name.endswith(skip):
            return None
        if name in kept:
            wq, s = kept.pop(name)
            return Fp8BlockLinear(wq.to(lin.weight.device), s.to(lin.weight.device), lin.bias, kernel)
        return Fp8BlockLinear.from_linear(lin, kernel)

    return replace_linears(model, make)
