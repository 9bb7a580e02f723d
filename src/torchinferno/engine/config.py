"""Typed configuration of the serving engine (scheduler, KV pool, limits)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from torchinferno.errors import ConfigError
from torchinferno.kernels.kv_dtype import parse_kv_cache_dtype

__all__ = ["EngineConfig", "parse_memory", "CPU_DEFAULTS", "CUDA_DEFAULTS"]

SCHEDULING_POLICIES = ("fcfs", "sjf", "priority")
# How steps of at most cuda_graph_piecewise_tokens replay (engine.graph_runner): attention eager between graphs, or
# one whole-step graph per token bucket (kernels.cuda_graphs_mixed)
MIXED_GRAPH_MODES = ("piecewise", "full")
# Step limits when none are given: a CPU is saturated by a few sequences; an H200-class GPU needs
# hundreds of sequences and thousands of tokens per step to be busy (vLLM's serving defaults).
CPU_DEFAULTS = {"max_num_seqs": 64, "max_num_batched_tokens": 512}
CUDA_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}

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
    the model's bytes per block, else on CUDA what ``gpu_memory_utilization`` of the device leaves
    after weights and activations, on CPU enough for ``max_num_seqs`` sequences of ``max_model_len``
    tokens capped by the RAM available (``engine.kv_sizing``). ``max_num_seqs`` and
    ``max_num_batched_tokens`` left ``None`` take the device's defaults (``CPU_DEFAULTS`` /
    ``CUDA_DEFAULTS``; see ``for_device``). ``max_model_len`` defaults to the model's
    context length (capped by the pool capacity); a request needs ``prompt + max_tokens <=
    max_model_len``. Without chunked prefill a whole prompt must fit one step's token budget, so
    ``max_num_batched_tokens`` is raised to ``max_model_len``.

    On a CUDA KV cache whose model's attention backends are capturable, plain decode steps
    replay per-batch-size CUDA graphs (``engine.graph_runner``), and a step that is one fresh prompt of at
    most ``cuda_graph_prefill_tokens`` tokens replays a per-length prefill graph (0: prefill eager); with
    ``graph_prefill_alone`` a lone waiting prompt of that kind gets such a step of its own (the decodes wait one step);
    any other step of at most ``cuda_graph_piecewise_tokens`` tokens (mixed decodes and prefill chunks, several prompts,
    prefix hits) replays piecewise graphs around eager attention (``kernels.cuda_graphs_piecewise``; 0: eager), or with
    ``cuda_graph_mixed_mode="full"`` one whole-step graph per token bucket (``kernels.cuda_graphs_mixed``: attention
    inside the graph on padded metadata; piecewise when the capture fails);
    ``enforce_eager=True`` keeps every step eager (debugging, or comparing against the graph path).

    ``kv_cache_dtype`` is the KV pool's storage dtype (a dtype or a ``--kv-cache-dtype`` spelling:
    ``auto``, ``bfloat16``, ``float16``, ``float32``, ``fp8``/``fp8_e4m3``, ``fp8_e5m2``). FP8 halves
    the KV bytes every decode step reads; values are stored unscaled and saturating
    (``kernels.kv_dtype``) and attention computes in the model's dtype. GQA families only.

    ``async_scheduling=True`` overlaps host work with the device: ``LLMEngine.step()`` schedules
    and launches step k+1 before step k's sampled tokens reach the host (the runner feeds them to
    step k+1 on the device), then processes step k's results while step k+1 runs. Outputs are
    the same as the synchronous engine's; each output is reported one ``step()`` later.

    ``batch_invariant=True``: a request's tokens and logprobs are bitwise the same alone or in any batch
    (``kernels.batch_invariant`` is applied to the model; a prompt is always prefilled whole, so chunked
    prefill and prefix caching are off; on CUDA steps run eager: no CUDA graphs). A request preempted under KV pressure is
    recomputed in one prefill and is then not guaranteed the same numbers.
    """

    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory: int | None = None  # bytes
    kv_cache_dtype: torch.dtype | str | None = None  # default: the model's parameter dtype; 'fp8' = float8_e4m3fn
    max_num_batched_tokens: int | None = None  # None: the device's default (for_device)
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_logprobs: int = 20
    enforce_eager: bool = False
    # With CUDA graphs: a step that is one fresh prompt of at most this many tokens replays a per-length prefill graph
    # (kernels.cuda_graphs_prefill: such a prefill is host-bound eagerly); 0 keeps every prefill eager
    cuda_graph_prefill_tokens: int = 512
    # With prefill graphs: a lone waiting fresh prompt they can replay runs in a step of its own, the running requests
    # waiting one step, instead of turning their decode step eager (engine.scheduler, "Lone graph prefill")
    graph_prefill_alone: bool = True
    # With CUDA graphs: every other step of at most this many tokens runs its non-attention ops from per-token-count
    # graphs, attention eager between them (kernels.cuda_graphs_piecewise); 0 keeps such steps eager
    cuda_graph_piecewise_tokens: int = 512
    # How those steps replay: "piecewise" (attention eager between graphs) or "full" (one graph per token bucket with
    # attention inside, kernels.cuda_graphs_mixed; opt-in until measured on a GPU)
    cuda_graph_mixed_mode: str = "piecewise"
    async_scheduling: bool | None = None  # None: on for CUDA (faster at every batch measured), off on CPU
    batch_invariant: bool = False
    tensor_parallel_size: int = 1  # > 1: engine.multiproc_executor spawns one worker rank per device
    pipeline_parallel_size: int = 1  # > 1: as many ranks, each a stage of layers (parallel/pipeline.py)
    # Order of the waiting queue (engine.scheduler): fcfs (arrival), sjf (shortest prompt first, ties by arrival) or
    # priority (SamplingParams.priority, lower first, ties by arrival); preempted requests always resume first.
    scheduling_policy: str = "fcfs"
    prefix_cache_eviction: str = "lru"  # cache.block_pool.EVICTION_POLICIES: lru (default) or fifo (research)

    def __post_init__(self) -> None:
        if self.batch_invariant:
            self.enable_chunked_prefill = False
            self.enable_prefix_caching = False
            self.enforce_eager = True  # a CUDA graph bucket pads the batch: M, and so cuBLAS's choice, would change
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_memory(self.kv_cache_memory)
        self.kv_cache_dtype = parse_kv_cache_dtype(self.kv_cache_dtype)
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "tensor_parallel_size",
                     "pipeline_parallel_size"):
            v = getattr(self, name)
            if v is None and name != "block_size":
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if self.tensor_parallel_size > 1 and self.pipeline_parallel_size > 1:
            raise ConfigError("tensor and pipeline parallelism together are not supported yet (set one of "
                              "tensor_parallel_size / pipeline_parallel_size to 1)")
        for name, off in (("cuda_graph_prefill_tokens", "eager prefill"), ("cuda_graph_piecewise_tokens", "eager mixed steps")):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{name} must be an integer >= 0 (0: {off}), got {v!r}")
        if self.cuda_graph_mixed_mode not in MIXED_GRAPH_MODES:
            raise ConfigError(f"cuda_graph_mixed_mode must be one of {', '.join(MIXED_GRAPH_MODES)}, "
                              f"got {self.cuda_graph_mixed_mode!r}")
        if not isinstance(self.graph_prefill_alone, bool):
            raise ConfigError(f"graph_prefill_alone must be True or False, got {self.graph_prefill_alone!r}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ConfigError(f"kv_cache_memory must be > 0 bytes, got {self.kv_cache_memory}")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ConfigError(f"async_scheduling must be True, False or None (the device's default), "
                              f"got {self.async_scheduling!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                              f"got {self.scheduling_policy!r}")
        if self.prefix_cache_eviction not in ("lru", "fifo"):
            raise ConfigError(f"prefix_cache_eviction must be lru or fifo, got {self.prefix_cache_eviction!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")

    def for_device(self, device: torch.device | str) -> "EngineConfig":
        """A copy whose unset step limits take ``device``'s defaults (``CPU_DEFAULTS`` / ``CUDA_DEFAULTS``) and
        whose unset ``async_scheduling`` is on for CUDA (H200, 8B: 4.3 vs 5.4 ms per batch-1 token, 7.0 vs
        8.1 ms per batch-64 step; benchmarks/RESULTS.md) and off on CPU (no device to overlap with)."""
        cuda = torch.device(device).type == "cuda"
        defaults = {**(CUDA_DEFAULTS if cuda else CPU_DEFAULTS), "async_scheduling": cuda}
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})
