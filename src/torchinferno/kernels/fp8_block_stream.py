"""Layer-by-layer block-FP8 build: ``--quantization fp8-block`` without ever holding the whole model in float.

A model is built on ``meta`` and cut, in parameter order, into pieces (:func:`model_pieces`): the modules before
the decoder layers (the embedding), each decoder layer, the modules after them (final norm, head). For each piece in
turn :func:`build_fp8_block_streamed` materializes it on the device in the model dtype (``module_utils.materialize``,
the whole-model loader's function), fills it (``fill(piece)``: random init, or its checkpoint tensors), swaps its
exact ``nn.Linear``s and ``RoutedExperts`` for block FP8 with the existing swap functions
(``kernels.fp8_block.swap_linear_for_fp8_block``, ``kernels.fp8_block_moe.swap_experts_for_fp8_block``: same rules,
the head kept) and lets the float copy go. Last, the root's own buffers (rope tables) are made and one whole-model
swap catches any linear outside the layers.

Invariants:

* the built model's state (every FP8 weight and scale, every float tensor kept) equals materialize -> fill ->
  ``quantize_model_fp8_block`` bitwise when ``fill`` writes what the whole-model fill writes; pieces are filled in
  parameter order, so a fill drawing from one generator draws the same numbers;
* float bytes alive at once <= the built model's float bytes + the largest piece's (:class:`BuildStats`: weak
  references to every tensor materialized, so a float copy kept alive by mistake stays counted);
* a checkpoint load (:func:`load_model_fp8_block`) reads each tensor once. Before anything is read, the whole index
  goes through the family's ``load_weights`` on the meta model (meta tensors of the stored shapes and dtypes): a bad
  or missing tensor names itself before the first layer is built. Per piece, the raw FP8 pairs of the modules the
  swap replaces (``fp8_block_load.BlockPlan``: whole modules only) are kept as they are, never dequantized; every
  other tensor goes through ``load_weights(..., only=the piece's tensors but those kept modules' weights)``, whose
  checks (names, shapes, every tensor present) hold per piece.

Families: those whose ``load_weights`` takes ``only`` (:data:`STREAMED_FAMILIES`); others load whole, then quantize.
"""

from __future__ import annotations

import re
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

from torchinferno.errors import ConfigError

STREAMED_FAMILIES = ("deepseek-v3.2",)  # their load_weights fill one piece (``only=``)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")

Kept = tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, tuple[torch.Tensor, ...]]]
"""(linears, experts) a piece's checkpoint keeps as FP8, by full module name (``fp8_block_load.BlockPlan.assemble``)."""

__all__ = ["Piece", "BuildStats", "model_pieces", "build_fp8_block_streamed", "load_model_fp8_block",
           "checkpoint_fill", "float_bytes", "STREAMED_FAMILIES"]


@dataclass
class Piece:
    """A set of the model's modules built together: ``modules`` maps qualified name -> module (parameter order)."""

    label: str
    modules: dict[str, nn.Module]
    layer: int | None = None  # the decoder layer's index, None for the modules around the layers

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        for name, m in self.modules.items():
            for n, p in m.named_parameters():
                yield f"{name}.{n}", p

    def named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, m in self.modules.items():
            for n, b in m.named_buffers():
                yield f"{name}.{n}", b

    def state_names(self) -> set[str]:
        """Internal names of the tensors a checkpoint fills (parameters + persistent buffers)."""
        return {k for name, m in self.modules.items() for k in m.state_dict(prefix=f"{name}.", keep_vars=True)}


def model_pieces(model: nn.Module) -> list[Piece]:
    """The pieces of a ``CausalLMBase`` model (``model.model.layers`` a ModuleList) in parameter order:
    the modules before the layers, each layer, the modules after. ConfigError for another layout."""
    stack = getattr(model, "model", None)
    layers = getattr(stack, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"{type(model).__name__}: a layer-by-layer build needs model.model.layers (a ModuleList)")
    if list(model.parameters(recurse=False)) or any(
            n not in model._non_persistent_buffers_set for n, _ in model.named_buffers(recurse=False)):
        raise ConfigError(f"{type(model).__name__}: a layer-by-layer build needs a root without tensors of its own "
                          "(but non-persistent buffers it rebuilds)")
    pieces: list[Piece] = []
    run: dict[str, nn.Module] = {}

    def flush() -> None:
        if run:
            pieces.append(Piece(f"outside {len([p for p in pieces if p.layer is None])}", dict(run)))
            run.clear()

    for name, child in model.named_children():
        if child is not stack:
            run[name] = child
            continue
        if list(stack.parameters(recurse=False)) or list(stack.buffers(recurse=False)):
            raise ConfigError(f"{type(stack).__name__}: a layer-by-layer build needs a stack without own tensors")
        for sname, schild in stack.named_children():
            if schild is layers:
                flush()
                pieces += [Piece(f"layer {i}", {f"{name}.layers.{i}": layer}, i) for i, layer in enumerate(layers)]
            else:
                run[f"{name}.{sname}"] = schild
    flush()
    return pieces


def float_bytes(model: nn.Module) -> int:
    """Bytes of the model's materialized tensors that are not block FP8 (the float weights a build holds)."""
    from torchinferno.kernels.fp8_block import Fp8BlockLinear
    from torchinferno.kernels.fp8_block_moe import Fp8BlockExperts

    fp8 = {id(t) for m in model.modules() if isinstance(m, (Fp8BlockLinear, Fp8BlockExperts)) for t in m.buffers()}
    seen: set[int] = set()
    total = 0
    for t in (*model.parameters(), *model.buffers()):
        if t.is_meta or id(t) in fp8 or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


@dataclass
class BuildStats:
    """What a layer-by-layer build held. Bytes count the float tensors materialized (block-FP8 bytes excluded)."""

    pieces: int = 0
    peak_float_bytes: int = 0  # alive at once, highest over the samples taken after each piece's fill
    final_float_bytes: int = 0  # still alive when built (embedding, head, norms, MLA kv_b_proj, routers)
    max_piece_bytes: int = 0  # the largest piece as materialized
    total_piece_bytes: int = 0  # every piece as materialized: the whole float model load-then-quantize holds at once
    kept: int = 0  # modules that took the checkpoint's own FP8 blocks
    swapped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cuda_peak_bytes: int | None = None  # torch.cuda.max_memory_allocated over the build (CUDA only)

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "swapped"} | {"swapped": len(self.swapped)}


class _Meter:
    """Float bytes alive among the tensors it was shown (weak references: freed tensors drop out)."""

    def __init__(self) -> None:
        self._refs: list[tuple[weakref.ref, int]] = []

    def track(self, t: torch.Tensor) -> int:
        n = t.numel() * t.element_size()
        self._refs.append((weakref.ref(t), n))
        return n

    def live(self) -> int:
        return sum(n for ref, n in self._refs if ref() is not None)


def build_fp8_block_streamed(model: nn.Module, device: str | torch.device, dtype: torch.dtype,
                             fill: Callable[[Piece], Kept | None], kernel: str = "auto") -> BuildStats:
    """Materialize, fill and swap ``model`` (built on ``meta``) piece by piece (module docstring), in place.
    ``fill(piece)`` writes the piece's tensors and returns the FP8 blocks to keep (or None: quantize the filled
    weights). Sets ``model.fp8_block_kept`` as ``quantize_model_fp8_block`` does; ConfigError if nothing swapped."""
    from torchinferno.kernels.fp8_block import swap_linear_for_fp8_block
    from torchinferno.kernels.fp8_block_moe import swap_experts_for_fp8_block
    from torchinferno.models.common.module_utils import materialize

    t0 = time.perf_counter()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stats, meter = BuildStats(), _Meter()
    left_lin: dict = {}
    left_exp: dict = {}
    for piece in model_pieces(model):
        for m in piece.modules.values():
            materialize(m, device, dtype)
        size = sum(meter.track(t) for _, t in (*piece.named_parameters(), *piece.named_buffers()))
        stats.max_piece_bytes = max(stats.max_piece_bytes, size)
        stats.total_piece_bytes += size
        with torch.no_grad():
            kept_lin, kept_exp = fill(piece) or ({}, {})
        stats.peak_float_bytes = max(stats.peak_float_bytes, meter.live())
        for name, m in piece.modules.items():
            pre = f"{name}."
            lin = {k.removeprefix(pre): kept_lin.pop(k) for k in list(kept_lin) if k.startswith(pre)}
            exp = {k.removeprefix(pre): kept_exp.pop(k) for k in list(kept_exp) if k.startswith(pre)}
            n = len(lin) + len(exp)
            stats.swapped += [pre + s for s in swap_linear_for_fp8_block(m, kernel=kernel, kept=lin)]
            stats.swapped += [pre + s for s in swap_experts_for_fp8_block(m, kernel=kernel, kept=exp)]
            stats.kept += n - len(lin) - len(exp)
        left_lin.update(kept_lin)  # a piece's root module itself (only the whole-model pass below can replace it)
        left_exp.update(kept_exp)
        stats.pieces += 1
        if device.type == "cuda":  # the float layer's cached blocks freed: the next layer won't fragment around FP8
            torch.cuda.empty_cache()
    model.to_empty(device=device, recurse=False)  # the root's non-persistent buffers (CausalLMBase: rope tables)
    n = len(left_lin) + len(left_exp)
    stats.swapped += swap_linear_for_fp8_block(model, kernel=kernel, kept=left_lin)
    stats.swapped += swap_experts_for_fp8_block(model, kernel=kernel, kept=left_exp)
    stats.kept += n - len(left_lin) - len(left_exp)
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left and device.type != "meta":  # a meta build (sizes only) stays meta
        raise RuntimeError(f"layer-by-layer build left {len(left)} tensor(s) on meta, e.g. {left[:3]}")
    if not stats.swapped:
        raise ConfigError("--quantization fp8-block: the model has no nn.Linear layers or routed experts to quantize")
    model.eval()
    model.fp8_block_kept = stats.kept
    stats.final_float_bytes = meter.live()
    stats.seconds = time.perf_counter() - t0
    if device.type == "cuda":
        stats.cuda_peak_bytes = torch.cuda.max_memory_allocated(device)
    model.fp8_block_build = stats
    return stats


def checkpoint_fill(model: nn.Module, family, ckpt: str | Path, pieces: list[Piece]) -> Callable[[Piece], Kept]:
    """``fill`` for a checkpoint load: a piece's tensors (index names routed to it: ``model.layers.N.*`` to layer N,
    names of the other pieces' tensors to them, anything else to the last piece, where ``load_weights`` skips it;
    layers past the model's, which the family skips, are not read), read once; the raw FP8 pairs of swapped modules
    are kept (their bits, not a re-quantization).
    Checks the whole index on the meta model first (module docstring)."""
    from torchinferno.checkpoint.fp8 import SCALE_SUFFIX
    from torchinferno.checkpoint.safetensors_io import iter_tensors, tensor_index
    from torchinferno.kernels.fp8_block_load import BlockPlan

    index = tensor_index(ckpt)
    family.load_weights(model, ((n, torch.empty(i.shape, dtype=i.torch_dtype, device="meta"))
                                for n, i in index.items()))  # names, shapes, coverage: nothing read yet
    plan = BlockPlan.of(model, index)
    layer_piece = {p.layer: p.label for p in pieces if p.layer is not None}
    owner = {n: p.label for p in pieces if p.layer is None for n in p.state_names()}
    names: dict[str, list[str]] = {p.label: [] for p in pieces}
    for n in index:
        m = _LAYER.match(n)
        if m and int(m.group(1)) in layer_piece:
            names[layer_piece[int(m.group(1))]].append(n)
        elif m:  # past the last layer: the check above passed, so multi-token-prediction layers the load skips
            continue  # (DeepSeek-V3's: 11 GB of FP8 not read)
        else:
            names[owner.get(n.removesuffix(SCALE_SUFFIX), pieces[-1].label)].append(n)

    def fill(piece: Piece) -> Kept:
        mine = names[piece.label]
        kept = plan.complete({n for n in mine if n in plan.wanted})  # module -> the float tensors its blocks replace
        raw_names = {x for n in mine if n in plan.wanted and plan.module_of(n) in kept for x in (n, n + SCALE_SUFFIX)}
        raw: dict[str, torch.Tensor] = {}

        def rest() -> Iterator[tuple[str, torch.Tensor]]:
            for n, t in iter_tensors(ckpt, mine):
                if n in raw_names:
                    raw[n] = t  # the checkpoint's blocks, as they are
                else:
                    yield n, t

        # a kept module's float weight is left unwritten (replaced right after; its names and shapes were checked on
        # meta): no dequantization of the blocks that are kept
        family.load_weights(model, rest(), only=piece.state_names() - {t for ts in kept.values() for t in ts})
        return plan.assemble(raw)

    return fill


def load_model_fp8_block(model: str | Path, device: str | torch.device = "cpu", dtype=torch.float32,
                         variant: str | None = None, cache_dir: str | Path | None = None,
                         kernel: str = "auto") -> nn.Module | None:
    """``load_model_auto`` + ``quantize_model_fp8_block`` built layer by layer (same result, bitwise), or None for a
    checkpoint whose family is not in :data:`STREAMED_FAMILIES` (the caller loads it whole). The model has
    ``.family``, ``.checkpoint_dir``, ``.fp8_block_kept`` and ``.fp8_block_build`` (:class:`BuildStats`)."""
    from torchinferno.checkpoint.auto import _resolve, default_attention_backend, resolve_dtype

    ckpt, family, config = _resolve(model, cache_dir)
    if family.name not in STREAMED_FAMILIES:
        return None
    kw = {} if variant is None else {"variant": variant}
    backend = default_attention_backend(family, config, device)
    if backend is not None:
        kw["attention_backend"] = backend
    m = family.build(config, device="meta", **kw)
    pieces = model_pieces(m)
    fill = checkpoint_fill(m, family, ckpt, pieces)
    build_fp8_block_streamed(m, device, resolve_dtype(dtype), fill, kernel)
    m.family = family
    m.checkpoint_dir = Path(ckpt)
    return m
