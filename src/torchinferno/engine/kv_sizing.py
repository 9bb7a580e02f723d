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
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

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
