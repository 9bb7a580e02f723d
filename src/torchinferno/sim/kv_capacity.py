"""The simulated replica's KV pools, sized as the engine sizes them (``engine.kv_sizing.plan_kv_cache``).

A hybrid KV spec (``KVSpec.is_hybrid``, e.g. deepseek-v4: a sliding group freed behind its window plus a whole
group that keeps compressed 1/m entries) holds per sequence about ``window / block_size + 2`` sliding blocks and
one whole block per ``block_size`` tokens, each group at its own bytes per block. Counting every token at the full
``bytes_per_token`` (one pool) admits far fewer sequences than the engine does. This module does not repeat the
formulas: it calls the engine's planner with the byte budget (``kv_cache_memory``) or block count
(``num_gpu_blocks``) the simulation was given, on the CPU branch that never touches a model.

Invariant: for the same spec, dtype, resolved ``EngineConfig`` and budget, ``(num_blocks, num_sliding_blocks)``
equal the real engine's ``Worker.kv_plan``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.kv_sizing import KVPlan, plan_kv_cache
from torchinferno.errors import ConfigError
from torchinferno.models.protocol import KVSpec

__all__ = ["simulated_kv_plan"]


def simulated_kv_plan(spec: KVSpec, dtype: torch.dtype, config: EngineConfig, want_len: int,
                      kv_cache_memory: int | None = None) -> KVPlan:
    """The engine's KV plan for ``spec`` under ``config`` (resolved for its device: step limits set).
    ``kv_cache_memory`` (bytes) overrides the config's; one of it or ``config.num_gpu_blocks`` /
    ``config.kv_cache_memory`` must be given (a simulation has no free device memory to measure)."""
    cfg = replace(config)
    if kv_cache_memory is not None:
        cfg.kv_cache_memory, cfg.num_gpu_blocks = int(kv_cache_memory), None
    if cfg.kv_cache_memory is None and cfg.num_gpu_blocks is None:
        raise ConfigError("a simulated KV pool needs kv_cache_memory (bytes) or num_gpu_blocks")
    return plan_kv_cache(None, spec, dtype, cfg, want_len, torch.device("cpu"))
