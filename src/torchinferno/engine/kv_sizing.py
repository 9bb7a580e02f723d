"""How big the KV pool is: explicit sizes, free device memory on CUDA, a share of RAM on CPU.

``plan_kv_cache`` decides the number of blocks before anything is allocated:

* ``num_gpu_blocks`` or ``kv_cache_memory`` given: exactly that;
* CUDA: the pool takes what is left of ``gpu_memory_utilization`` x the device's memory after the
  weights, the peak activations of the largest step (measured by one profiling forward of
  ``max_num_batched_tokens`` tokens), memory the process holds outside PyTorch (CUDA context,
  cuBLAS workspaces, other processes on the device) and a reserve for CUDA graphs (vLLM's
  ``--gpu-memory-utilization`` rule);
* CPU: enough for ``max_num_seqs`` sequences of the model's context length, capped at a share of
  the RAM available when the engine starts (``CPU_KV_RAM_FRACTION``) and at ``CPU_KV_MAX_BYTES``.

Hybrid specs (``KVSpec.is_hybrid``: a sliding group freed behind its window + a whole-sequence group) get two
pools, costed per group (``hybrid_split``; per-window tensors packed, as the engine allocates them): the sliding
pool takes what every running sequence's window plus one step's tokens need (``sliding_blocks_needed``; at most
half a memory budget), the whole group the rest. With ``num_gpu_blocks`` the whole group gets that many blocks and
the sliding pool at most as many.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from torchinferno.cache.block_pool import cdiv
from torchinferno.engine.config import EngineConfig
from torchinferno.errors import ConfigError
from torchinferno.models.protocol import KVSpec

__all__ = ["KVPlan", "plan_kv_cache", "CPU_KV_RAM_FRACTION", "CPU_KV_MAX_BYTES", "CUDA_GRAPH_RESERVE_BYTES"]

CPU_KV_RAM_FRACTION = 0.25
CPU_KV_MAX_BYTES = 2 * 1024**3
# Memory set aside for captured CUDA graphs (their private pools) when sizing from free memory.
CUDA_GRAPH_RESERVE_BYTES = 1024**3


@dataclass(frozen=True)
class KVPlan:
    num_blocks: int
    reason: str  # how the size was chosen (shown by ``describe``)
    num_sliding_blocks: int | None = None  # hybrid specs: the sliding group's pool


def sliding_blocks_needed(window: int, block_size: int, max_num_seqs: int, max_step_tokens: int) -> int:
    """Sliding blocks that never make the scheduler wait: each running sequence holds the blocks of
    ``[c - window, c)`` (``cdiv(window, bs) + 1``) plus its partial last block, and one step adds at most
    ``max_step_tokens`` tokens (``cdiv`` of that in blocks)."""
    return max_num_seqs * (cdiv(window, block_size) + 2) + cdiv(max_step_tokens, block_size)


def hybrid_split(spec: KVSpec, dtype: torch.dtype, block_size: int, budget: int, sliding_need: int,
                 whole_ids: int) -> tuple[int, int]:
    """``budget`` bytes -> (whole blocks, sliding blocks): the sliding pool first (``sliding_need``, at most half
    the budget while the whole group stores anything), the whole group the rest. A whole group that stores nothing
    per token gets ``whole_ids`` block ids (they cost no memory) and the sliding pool the whole budget."""
    whole_pb = spec.group_bytes_per_block(dtype, block_size, sliding=False, pack=True)
    slide_pb = spec.group_bytes_per_block(dtype, block_size, sliding=True, pack=True)
    if whole_pb == 0:
        return whole_ids, budget // slide_pb
    s = min(sliding_need, (budget // 2) // slide_pb)
    return (budget - s * slide_pb) // whole_pb, s


def _available_ram() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def profile_lengths(num_tokens: int, num_seqs: int, max_len: int) -> list[int]:
    """Sequence lengths of the profiling step: ``num_tokens`` in at least ``num_seqs`` sequences, none longer
    than ``max_len`` (positions past the context would index past the rope tables)."""
    n = max(1, min(max(num_seqs, -(-num_tokens // max_len)), num_tokens))
    return [num_tokens // n + (1 if i < num_tokens % n else 0) for i in range(n)]


@torch.inference_mode()
def _profile_peak_activation_bytes(model: nn.Module, num_tokens: int, num_seqs: int, max_len: int) -> int:
    """Peak bytes a forward of ``num_tokens`` tokens (in ``num_seqs`` sequences of at most ``max_len`` tokens,
    no KV cache) + its logits allocate beyond what was allocated before it."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    device = next(model.parameters()).device
    lens = profile_lengths(num_tokens, num_seqs, max_len)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    ids = torch.zeros(sum(lens), dtype=torch.long, device=device)
    pos = torch.cat([torch.arange(n, device=device) for n in lens])
    meta = build_attention_metadata(lens, [0] * len(lens), [[i] for i in range(len(lens))], max(lens), device)
    hidden = model(ids, pos, None, meta)
    model.compute_logits(hidden[meta.last_token_indices()])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del hidden
    torch.cuda.empty_cache()
    return max(0, peak)


def plan_kv_cache(model: nn.Module, spec: KVSpec, dtype: torch.dtype, config: EngineConfig, want_len: int,
                  device: torch.device) -> KVPlan:
    """The pool size for ``model`` under ``config`` (module docstring). Raises ``ConfigError`` when
    nothing fits."""
    if not spec.is_hybrid:
        return _plan(model, spec, dtype, config, want_len, device)
    bs, W = config.block_size, spec.sliding_window
    step_tokens = config.max_num_batched_tokens if config.enable_chunked_prefill else max(
        config.max_num_batched_tokens, want_len)
    need = sliding_blocks_needed(W, bs, config.max_num_seqs, step_tokens)
    whole_ids = cdiv(want_len, bs) * config.max_num_seqs
    one_seq = cdiv(W, bs) + 2  # one sequence's window + its decode block
    if config.num_gpu_blocks is not None:
        n, s, reason = config.num_gpu_blocks, min(config.num_gpu_blocks, need), "num_gpu_blocks"
    else:
        whole_pb = spec.group_bytes_per_block(dtype, bs, sliding=False, pack=True)
        slide_pb = spec.group_bytes_per_block(dtype, bs, sliding=True, pack=True)
        per_seq_blocks = cdiv(want_len, bs)
        # the single-group plan's bytes are the budget (kv_cache_memory / free CUDA memory / the CPU RAM cap)
        base = _plan(model, spec, dtype, config, want_len, device)
        budget = config.kv_cache_memory or base.num_blocks * spec.bytes_per_token(dtype) * bs
        if device.type == "cpu" and config.kv_cache_memory is None:  # CPU default: what max_num_seqs sequences need
            budget = min(budget, per_seq_blocks * config.max_num_seqs * whole_pb + need * slide_pb)
        n, s = hybrid_split(spec, dtype, bs, budget, need, whole_ids)
        reason = base.reason
    if s < one_seq:
        raise ConfigError(f"the sliding KV pool ({s} blocks of {bs} tokens) cannot hold one sequence's window of {W} "
                          "tokens and its next block; raise the KV cache size")
    if n < 1:
        raise ConfigError("the KV cache holds no block of the whole-sequence group; raise the KV cache size")
    return KVPlan(n, f"{reason}; sliding pool {s} blocks (window {W})", s)


def _plan(model: nn.Module, spec: KVSpec, dtype: torch.dtype, config: EngineConfig, want_len: int,
          device: torch.device) -> KVPlan:
    """One group: every block costs ``bytes_per_token * block_size``."""
    bs = config.block_size
    per_block = spec.bytes_per_token(dtype) * bs
    if per_block <= 0:
        raise ConfigError("the model's KV spec stores nothing per token")
    if config.num_gpu_blocks is not None:
        return KVPlan(config.num_gpu_blocks, "num_gpu_blocks")
    if config.kv_cache_memory is not None:
        n = config.kv_cache_memory // per_block
        if n < 1:
            raise ConfigError(f"KV cache memory {config.kv_cache_memory} bytes holds no block (one block needs {per_block} bytes)")
        return KVPlan(n, f"kv_cache_memory {config.kv_cache_memory / 2**20:.0f} MiB")
    if device.type == "cuda":
        weights = torch.cuda.memory_allocated(device)
        activations = _profile_peak_activation_bytes(model, config.max_num_batched_tokens, config.max_num_seqs, want_len)
        free, total = torch.cuda.mem_get_info(device)
        outside_torch = (total - free) - torch.cuda.memory_reserved(device)
        reserve = 0 if config.enforce_eager else CUDA_GRAPH_RESERVE_BYTES
        budget = int(total * config.gpu_memory_utilization) - weights - activations - max(0, outside_torch) - reserve
        n = budget // per_block
        if n < 1:
            raise ConfigError(
                f"no memory left for the KV cache: {config.gpu_memory_utilization:.2f} x {total / 2**30:.1f} GiB minus "
                f"{weights / 2**30:.2f} GiB already allocated (weights, other engines), activations {activations / 2**30:.2f} GiB and "
                f"{max(0, outside_torch) / 2**30:.2f} GiB outside PyTorch; raise --gpu-memory-utilization or lower "
                "--max-num-batched-tokens")
        return KVPlan(n, f"{config.gpu_memory_utilization:.2f} of {total / 2**30:.0f} GiB after weights "
                         f"{weights / 2**30:.1f} GiB + activations {activations / 2**30:.2f} GiB")
    need = -(-want_len // bs) * config.max_num_seqs
    cap = CPU_KV_MAX_BYTES
    ram = _available_ram()
    if ram is not None:
        cap = min(cap, int(ram * CPU_KV_RAM_FRACTION))
    n = max(1, min(need, cap // per_block))
    return KVPlan(n, "max_num_seqs full-length sequences" if n == need else
                  f"capped at {cap / 2**20:.0f} MiB ({CPU_KV_RAM_FRACTION:.0%} of available RAM, at most "
                  f"{CPU_KV_MAX_BYTES / 2**30:.0f} GiB)")
