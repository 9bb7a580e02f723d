"""``SimulatedExecutor``: an ``Executor`` that advances a virtual clock instead of running a model.

The real ``EngineCore`` (and so the real ``Scheduler`` and ``BlockPool``) drives it unchanged: every
``SchedulerOutput`` reaches ``execute_async``, which returns a dummy token for each sampling row; the cost
model's prediction for the step is added to the clock when the core takes the step's result (at once in the
synchronous engine, one ``step()`` later with async scheduling, as on the device). Requests stop by ``max_tokens`` (the simulator submits
them with ``ignore_eos``), so the dummy token's value never matters (it is never a stop token: the simulated
core has no EOS ids). Invariant: ``clock.t`` only grows, by exactly one prediction per step whose result was taken.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.executor import Executor
from torchinferno.engine.outputs import ModelRunnerOutput, SchedulerOutput
from torchinferno.errors import ConfigError
from torchinferno.sim.cost_model import CostModel
from torchinferno.sim.timeline import Timeline, TimelineModel, batch_shape

__all__ = ["DUMMY_TOKEN", "CpuClock", "SimulatedExecutor", "VirtualClock", "WallClock", "make_clock"]

DUMMY_TOKEN = 0


class VirtualClock:
    """Simulated seconds; ``advance_to`` never goes back."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt

    def advance_to(self, t: float) -> None:
        self.t = max(self.t, t)


class WallClock:
    """Real seconds since construction; ``advance_to`` sleeps (the real engine's driver)."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def advance(self, dt: float) -> None:  # pragma: no cover - the real engine advances it
        time.sleep(max(0.0, dt))

    def advance_to(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            time.sleep(dt)


class CpuClock:
    """This process's CPU seconds (``time.process_time``) since construction; ``advance_to`` jumps instead of
    sleeping. On a shared host a single-threaded engine measured on this clock reads as if it had a core to
    itself (time spent descheduled does not count); cache and memory-bandwidth interference still do."""

    def __init__(self):
        self.t0 = time.process_time()
        self.offset = 0.0

    def now(self) -> float:
        return time.process_time() - self.t0 + self.offset

    def advance(self, dt: float) -> None:  # pragma: no cover - the real engine advances it
        self.offset += max(0.0, dt)

    def advance_to(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            self.offset += dt


def make_clock(kind: str):
    """``"wall"`` (``WallClock``) or ``"cpu"`` (``CpuClock``): how real steps are timed."""
    if kind == "wall":
        return WallClock()
    if kind == "cpu":
        return CpuClock()
    raise ConfigError(f"unknown clock {kind!r} (valid: wall, cpu)")


class _Pending:
    """A launched virtual step (the ``StepHandle`` surface the core uses): the clock advances by the step's
    cost when its result is taken, once. Synchronous engine: at once. Async scheduling: when the core waits for
    it, one ``step()`` later, which is when the device would have finished it."""

    __slots__ = ("cost", "counted", "ex", "out")

    def __init__(self, ex: SimulatedExecutor, cost: float, out: ModelRunnerOutput, counted: bool = False):
        self.ex, self.cost, self.out, self.counted = ex, cost, out, counted

    def result(self) -> ModelRunnerOutput:
        if self.cost is not None:
            self.ex.clock.advance(self.cost)
            self.ex.busy_s += self.cost
            self.ex._outstanding -= self.counted
            self.cost = None
        return self.out

    def ready(self) -> bool:
        return True


class _TimedPending:
    """A launched virtual step under a ``TimelineModel``: the host clock already paid the launch; taking the result
    waits for the step's device end, then pays its apply time (``timeline.Timeline.resolve``)."""

    __slots__ = ("counted", "device_end", "ex", "out", "shape")

    def __init__(self, ex: SimulatedExecutor, device_end: float, shape, out: ModelRunnerOutput, counted: bool):
        self.ex, self.device_end, self.shape, self.out, self.counted = ex, device_end, shape, out, counted

    def result(self) -> ModelRunnerOutput:
        if self.device_end is not None:
            ex = self.ex
            t0 = ex.clock.now()
            ex.clock.advance_to(ex.timeline.resolve(t0, self.device_end, self.shape))
            ex.busy_s += ex.clock.now() - t0
            ex._outstanding -= self.counted
            self.device_end = None
        return self.out

    def ready(self) -> bool:
        return True


class SimulatedExecutor(Executor):
    """A replica of ``num_blocks`` x ``block_size`` KV tokens whose steps cost ``cost_model`` seconds.

    ``external_prefill`` holds request ids whose prompt KV came from elsewhere (P/D decode replicas): their
    prefill rows cost nothing. ``config`` step limits left unset take ``device``'s defaults.

    ``cost_model`` is a ``CostModel`` (a step's whole cost lands when its result is taken) or a ``TimelineModel``
    (``sim.timeline``: the launch's host time lands at the launch, the result waits for the device's end, so
    under async scheduling the next step's host work overlaps this step's device work).

    ``kv_spec`` (a model family's ``KVSpec``) with ``kv_dtype`` and ``kv_cache_memory`` bytes (or the config's
    ``kv_cache_memory`` / ``num_gpu_blocks``, else ``num_blocks`` whole blocks): the pools are the engine's plan
    (``sim.kv_capacity``); a hybrid spec gets its sliding pool and window, so the real scheduler frees behind it.
    """

    def __init__(self, cost_model: CostModel | TimelineModel, config: EngineConfig | None = None, *, num_blocks: int = 4096,
                 max_model_len: int = 4096, device: str = "cpu", clock: VirtualClock | None = None,
                 kv_spec=None, kv_dtype=None, kv_cache_memory: int | None = None):
        config = replace(config or EngineConfig())
        if config.num_gpu_blocks is not None:
            num_blocks = config.num_gpu_blocks
        if num_blocks < 1:
            raise ConfigError(f"num_blocks must be >= 1, got {num_blocks}")
        self.config = config.for_device(device)  # async scheduling as the device's engine runs (CUDA: on)
        self.block_size = self.config.block_size
        self.num_blocks = num_blocks
        if kv_spec is not None:  # pools sized as the engine sizes them (sim/kv_capacity.py; hybrid specs: two)
            from torchinferno.sim.kv_capacity import simulated_kv_plan

            budget = kv_cache_memory if kv_cache_memory is not None else self.config.kv_cache_memory
            cfg = self.config if budget is not None else replace(self.config, num_gpu_blocks=num_blocks)
            plan = simulated_kv_plan(kv_spec, kv_dtype or torch.bfloat16, cfg,
                                     self.config.max_model_len or max_model_len, budget)
            self.num_blocks = plan.num_blocks
            if plan.num_sliding_blocks is not None:
                self.num_sliding_blocks = plan.num_sliding_blocks
                self.sliding_window = kv_spec.sliding_window
        cap = self.num_blocks * self.block_size
        self.max_model_len = min(self.config.max_model_len or max_model_len, cap)
        if not self.config.enable_chunked_prefill and self.config.max_num_batched_tokens < self.max_model_len:
            self.config.max_num_batched_tokens = self.max_model_len  # as Worker does: a prompt fits one step
        self.cost_model = cost_model
        self.clock = clock or VirtualClock()
        self.timeline = Timeline(cost_model) if isinstance(cost_model, TimelineModel) else None
        if self.timeline is not None and cost_model.graphs:  # the engine core sets its scheduler's lone prefill by it
            self.prefill_graph_tokens = cost_model.prefill_graph_tokens
            self.piecewise_graph_tokens = cost_model.piecewise_graph_tokens or cost_model.mixed_graph_tokens
            self.mixed_graph_mode = ("full" if cost_model.mixed_graph_tokens else
                                     "piecewise" if cost_model.piecewise_graph_tokens else "eager")
        self.external_prefill: set[str] = set()
        self._forwards = 0
        self._outstanding = 0  # launched steps whose result was not taken yet
        self.busy_s = 0.0

    def execute_async(self, sched: SchedulerOutput) -> _Pending:
        out = ModelRunnerOutput()
        if sched.scheduled:
            self._forwards += 1
            out.sampled_token_ids = {s.request_id: DUMMY_TOKEN for s in sched.scheduled if s.sample}
        drained = bool(self.config.async_scheduling) and self._outstanding == 0  # cost_model: drained_prefill
        counted = bool(sched.scheduled)  # the core takes the result of every step that scheduled something
        self._outstanding += counted
        if self.timeline is not None:
            shape = batch_shape(sched, self.external_prefill) if sched.scheduled else None
            t0 = self.clock.now()
            self.clock.advance_to(self.timeline.launch(t0, shape))
            self.busy_s += self.clock.now() - t0
            if shape is None:
                self._outstanding -= counted
                return _Pending(self, None, out)
            return _TimedPending(self, self.timeline.last_device_end, shape, out, counted)
        return _Pending(self, self.cost_model.step_cost(sched, self.external_prefill, drained), out, counted)

    @property
    def num_forward_calls(self) -> int:
        return self._forwards

    def describe(self) -> str:
        c = self.config
        sliding = ("" if self.num_sliding_blocks is None
                   else f" + {self.num_sliding_blocks} sliding-window blocks (window {self.sliding_window})")
        return (f"simulated: {self.num_blocks} blocks x {self.block_size} tokens{sliding}, max_model_len={self.max_model_len}, "
                f"max_num_seqs={c.max_num_seqs}, max_num_batched_tokens={c.max_num_batched_tokens}")
