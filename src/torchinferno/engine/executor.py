"""Executors: how the engine core runs a scheduled step on the worker(s) that hold the model.

The engine core only ever calls an ``Executor``: it asks it for the KV pool's geometry once, then
hands it every ``SchedulerOutput`` in order and gets sampled tokens back. How many workers there
are (one in-process worker today; one ``torch.distributed`` rank per device for tensor
parallelism) is the executor's business, so parallel executors slot in without reshaping the core.

A ``Worker`` owns one model replica (or one rank of it), its KV cache tensors and its model runner
(which picks the step backend once: eager module path, lean CPU step, fused CUDA step, CUDA graphs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from torchinferno.cache.kv_cache import PagedKVCache, allocate_kv_cache
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.graph_runner import make_model_runner
from torchinferno.engine.kv_sizing import KVPlan, plan_kv_cache
from torchinferno.engine.model_runner import ModelRunner
from torchinferno.engine.outputs import ModelRunnerOutput, SchedulerOutput
from torchinferno.engine.step_handle import StepHandle
from torchinferno.errors import ConfigError
from torchinferno.kernels.kv_dtype import is_fp8
from torchinferno.models.common.step_model import cpu_kv_cache_dtype

__all__ = ["Executor", "UniprocExecutor", "Worker"]


def _model_max_len(model: nn.Module) -> int | None:
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


class Worker:
    """One model replica, its KV cache and its runner, on one device.

    Invariants: the cache tensors are allocated once here and never reallocated (CUDA graphs and the
    runner's block tables address them); ``config`` is the engine config resolved for this device.
    """

    def __init__(self, model: nn.Module, config: EngineConfig):
        family = getattr(model, "family", None)
        if family is None:
            raise ConfigError("model has no .family (build it through a ModelFamily or load_model_auto)")
        if config.batch_invariant:
            from torchinferno.kernels.batch_invariant import make_batch_invariant

            make_batch_invariant(model)  # before the runner: it must not capture a batch-dependent fast path
        param = next(model.parameters())
        self.model = model
        self.device = param.device
        self.config = config = config.for_device(self.device)
        # CPU: fp32 for TorchAttention (no per-layer conversion of the context), or the activation dtype when the
        # lean step reads the cache natively (models/common/step_model.cpu_kv_cache_dtype)
        dtype = config.kv_cache_dtype or (cpu_kv_cache_dtype(model) if self.device.type == "cpu" else param.dtype)
        spec = family.kv_spec(model.config)
        if is_fp8(dtype) and any(layer.kind != "mha" for layer in spec.layers):
            raise ConfigError(f"kv_cache_dtype {dtype} supports k/v (GQA) caches only; family {family.name!r} stores "
                              f"{sorted({layer.kind for layer in spec.layers})} (use kv_cache_dtype auto)")
        model_len = _model_max_len(model)
        if config.max_model_len is not None and model_len is not None and config.max_model_len > model_len:
            raise ConfigError(f"max_model_len={config.max_model_len} exceeds the model's context length {model_len}")
        want_len = config.max_model_len or model_len or 2048
        self.kv_plan: KVPlan = plan_kv_cache(model, spec, dtype, config, want_len, self.device)
        self.kv_cache: PagedKVCache = allocate_kv_cache(spec, config.block_size, dtype, self.device,
                                                        num_blocks=self.kv_plan.num_blocks,
                                                        num_sliding_blocks=self.kv_plan.num_sliding_blocks,
                                                        pack=True)  # per-window tensors: one row per window
        capacity = self.kv_cache.num_tokens
        if config.max_model_len is not None and config.max_model_len > capacity:
            raise ConfigError(f"max_model_len={config.max_model_len} does not fit the KV cache "
                              f"({self.kv_cache.num_blocks} blocks x {config.block_size} = {capacity} tokens); "
                              "raise kv_cache_memory")
        self.max_model_len = min(want_len, capacity)
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < self.max_model_len:
            config.max_num_batched_tokens = self.max_model_len  # a whole prompt must fit one step
        self.runner: ModelRunner = make_model_runner(model, self.kv_cache, config, self.max_model_len)


class Executor(ABC):
    """Runs scheduled steps. ``execute_async`` sees every ``SchedulerOutput`` of the engine, in order."""

    config: EngineConfig  # resolved for the device (step limits filled in)
    max_model_len: int
    num_blocks: int
    block_size: int
    num_sliding_blocks: int | None = None  # hybrid KV specs: the sliding group's pool (else None)
    sliding_window: int = 0  # hybrid KV specs: the window W the scheduler frees behind
    prefill_graph_tokens: int = 0  # the longest fresh prompt one step replays from a prefill graph (0: none)
    piecewise_graph_tokens: int = 0  # the most tokens another step runs from piecewise graphs (0: none; cost only)
    mixed_graph_mode: str = "eager"  # how those steps replay: "piecewise", "full" (one graph a step) or "eager"

    @abstractmethod
    def execute_async(self, sched: SchedulerOutput) -> StepHandle:
        """Launch one step; the handle's ``result()`` waits for its sampled tokens."""

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_async(sched).result()

    @property
    @abstractmethod
    def num_forward_calls(self) -> int: ...

    @property
    def num_graph_steps(self) -> int:
        return 0

    @abstractmethod
    def describe(self) -> str: ...

    def shutdown(self) -> None:
        """Release workers (no-op in process)."""


class UniprocExecutor(Executor):
    """One ``Worker`` in this process: the executor of a single-device engine."""

    def __init__(self, model: nn.Module, config: EngineConfig):
        self.worker = Worker(model, config)
        self.config = self.worker.config
        self.max_model_len = self.worker.max_model_len
        self.num_blocks = self.worker.kv_cache.num_blocks
        self.block_size = self.worker.kv_cache.block_size
        self.num_sliding_blocks = self.worker.kv_cache.num_sliding_blocks
        self.sliding_window = self.worker.kv_cache.spec.sliding_window
        self.prefill_graph_tokens = self.worker.runner.prefill_graph_tokens
        self.piecewise_graph_tokens = self.worker.runner.piecewise_graph_tokens
        self.mixed_graph_mode = self.worker.runner.mixed_graph_mode

    # The worker's parts, for tests, warm-up and introspection on a single-device engine.
    @property
    def model(self) -> nn.Module:
        return self.worker.model

    @property
    def kv_cache(self) -> PagedKVCache:
        return self.worker.kv_cache

    @property
    def runner(self) -> ModelRunner:
        return self.worker.runner

    @property
    def device(self) -> torch.device:
        return self.worker.device

    def execute_async(self, sched: SchedulerOutput) -> StepHandle:
        return self.worker.runner.execute_async(sched)

    @property
    def num_forward_calls(self) -> int:
        return self.worker.runner.num_forward_calls

    @property
    def num_graph_steps(self) -> int:
        return self.worker.runner.num_graph_steps

    def describe(self) -> str:
        kv = self.kv_cache
        sliding = "" if kv.num_sliding_blocks is None else f" + {kv.num_sliding_blocks} sliding-window blocks"
        return (f"{kv.num_blocks}{sliding} blocks x {kv.block_size} tokens ({kv.nbytes / 2**20:.1f} MiB, {kv.dtype}; "
                f"{self.worker.kv_plan.reason}), max_model_len={self.max_model_len}, device={self.device}, "
                f"max_num_seqs={self.config.max_num_seqs}, max_num_batched_tokens={self.config.max_num_batched_tokens}, "
                f"runner={'cuda-graphs' if self.runner.uses_cuda_graphs else 'eager'}"
                f"{', whole-step mixed graphs' if self.runner.mixed_graph_mode == 'full' else ''}"
                f"{', async scheduling' if self.config.async_scheduling else ''}"
                f"{', batch-invariant' if self.config.batch_invariant else ''}")
