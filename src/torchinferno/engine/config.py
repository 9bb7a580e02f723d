"""Typed configuration of the serving engine (scheduler, KV pool, limits)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from torchinferno.errors import ConfigError
from torchinferno.kernels.kv_dtype import parse_kv_cache_dtype

__all__ = ["EngineConfig", "parse_memory", "DEFAULT_KV_CACHE_MEMORY"]

# Used when neither num_gpu_blocks nor kv_cache_memory is given: the pool is sized to hold
# max_num_seqs full-length sequences, but never more than this many bytes.
DEFAULT_KV_CACHE_MEMORY = 2 * 1024**3

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_memory(value: str | int) -> int:
    """``"64MiB"``, ``"1.5G"``, ``"1000000"`` or an int -> bytes."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot parse memory size {value!r} (examples: 67108864, 64MiB, 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass
class EngineConfig:
    """Knobs of one engine replica.

    The KV pool size is ``num_gpu_blocks`` when given, else ``kv_cache_memory`` bytes divided by
    the model's bytes per block, else enough for ``max_num_seqs`` sequences of ``max_model_len``
    tokens capped at ``DEFAULT_KV_CACHE_MEMORY``. ``max_model_len`` defaults to the model's
    context length (capped by the pool capacity); a request needs ``prompt + max_tokens <=
    max_model_len``. Without chunked prefill a whole prompt must fit one step's token budget, so
    ``max_num_batched_tokens`` is raised to ``max_model_len``.

    On a CUDA KV cache whose model's attention backends are capturable, plain decode steps
    replay per-batch-size CUDA graphs (``engine.graph_runner``); ``enforce_eager=True`` keeps
    every step eager (debugging, or comparing against the graph path).

    ``kv_cache_dtype`` is the KV pool's storage dtype (a dtype or a ``--kv-cache-dtype`` spelling:
    ``auto``, ``bfloat16``, ``float16``, ``float32``, ``fp8``/``fp8_e4m3``, ``fp8_e5m2``). FP8 halves
    the KV bytes every decode step reads; values are stored unscaled and saturating
    (``kernels.kv_dtype``) and attention computes in the model's dtype. GQA families only.

    ``async_scheduling=True`` overlaps host work with the device: ``LLMEngine.step()`` schedules
    and launches step k+1 before step k's sampled tokens reach the host (the runner feeds them to
    step k+1 on the device), then processes step k's results while step k+1 runs. Outputs are
    the same as the synchronous engine's; each output is reported one ``step()`` later.
    """

    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory: int | None = None  # bytes
    kv_cache_dtype: torch.dtype | str | None = None  # default: the model's parameter dtype; 'fp8' = float8_e4m3fn
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_logprobs: int = 20
    enforce_eager: bool = False
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_memory(self.kv_cache_memory)
        self.kv_cache_dtype = parse_kv_cache_dtype(self.kv_cache_dtype)
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ConfigError(f"kv_cache_memory must be > 0 bytes, got {self.kv_cache_memory}")
        if not isinstance(self.async_scheduling, bool):
            raise ConfigError(f"async_scheduling must be True or False, got {self.async_scheduling!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
