"""``EngineCore``: the scheduler + block pool driving an executor, in tokens only.

One ``step()`` = scheduler.schedule() -> executor.execute() -> scheduler.update_from_output(), and
returns one ``EngineCoreOutput`` per request that advanced. Text (detokenization, stop strings)
is not the core's business: the caller's ``OutputProcessor`` turns outputs into text and reports a
stop string back through ``finish_requests(..., "stop")``. The same class runs in-process (``LLM``,
``LLMEngine``) and inside the engine-core process of the server (``engine/core_proc.py``).

With ``EngineConfig.async_scheduling`` one step is kept in flight: ``step()`` schedules and launches
step k (inputs that step k-1 sampled are filled on the device), then waits for step k-1's sampled
tokens and applies them while the device runs step k, and returns step k-1's outputs. Invariants:
at most one launched step is unapplied between ``step()`` calls; steps are applied in launch order;
``has_unfinished()`` counts the in-flight step; when nothing is left to schedule, ``step()`` just
applies it. A request finished (abort, stop string) while its next step is in flight is finished at
once (blocks freed; device work is stream-ordered, so a later step reusing them runs after the
in-flight one) and that step's result for it is dropped.

Not thread-safe: one thread drives it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, astuple, dataclass

from torchinferno.cache.block_pool import BlockPool, hash_token_blocks
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.core_types import EngineCoreOutput, EngineCoreRequest
from torchinferno.engine.executor import Executor
from torchinferno.engine.outputs import ModelRunnerOutput, SchedulerOutput, TokenLogprob
from torchinferno.engine.request import Request, RequestStatus
from torchinferno.engine.scheduler import Scheduler
from torchinferno.engine.step_handle import StepHandle
from torchinferno.engine.step_log import StepShape, step_shape
from torchinferno.errors import ConfigError, SamplingError

__all__ = ["EngineCore", "EngineStats", "RequestLimits", "validate_request"]


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks referenced by live requests
    num_blocks: int
    block_size: int
    num_free_blocks: int
    num_cached_blocks: int
    prefix_queries: int  # tokens looked up in the prefix cache
    prefix_hits: int  # tokens found
    num_preemptions: int
    num_forward_calls: int
    num_steps: int
    max_batch_seqs: int  # largest number of requests in one forward
    max_batch_tokens: int  # largest number of tokens in one forward
    num_computed_tokens: int  # tokens run through the model (prefill, recompute and decode)
    num_generated_tokens: int
    num_finished: int
    num_aborted: int
    num_graph_steps: int = 0  # decode steps replayed from CUDA graphs
    # hybrid KV specs (a sliding-window group in its own pool): its size and free blocks (0 without one);
    # ``kv_usage`` is then the fuller of the two pools
    num_sliding_blocks: int = 0
    num_free_sliding_blocks: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "prefix_hit_rate": self.prefix_hit_rate}

    def as_list(self) -> list:
        """Field values in order: the compact form sent across the process boundary."""
        return list(astuple(self))


@dataclass(frozen=True)
class RequestLimits:
    """What a request is checked against before it reaches the core (also on the API side)."""

    max_model_len: int
    vocab_size: int | None
    max_logprobs: int


def validate_request(limits: RequestLimits, prompt_token_ids: list[int], params: SamplingParams) -> None:
    """Raise a ``TorchInfernoError`` for anything the engine cannot serve (the boundary check)."""
    params.validate()
    if params.n != 1:
        raise SamplingError("n > 1 is not supported by the engine; submit n requests")
    if params.logprobs is not None and not (0 <= params.logprobs <= limits.max_logprobs):
        raise SamplingError(f"logprobs must be in [0, {limits.max_logprobs}], got {params.logprobs}")
    if params.prompt_logprobs is not None and not (0 <= params.prompt_logprobs <= limits.max_logprobs):
        raise SamplingError(f"prompt_logprobs must be in [0, {limits.max_logprobs}], got {params.prompt_logprobs}")
    if not prompt_token_ids:
        raise ConfigError("empty prompt: at least one token is required")
    if limits.vocab_size is not None and any(not 0 <= int(t) < limits.vocab_size for t in prompt_token_ids):
        raise ConfigError(f"prompt token ids must be in [0, {limits.vocab_size})")
    total = len(prompt_token_ids) + params.max_tokens
    if total > limits.max_model_len:
        raise ConfigError(f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                          f"the context length {limits.max_model_len}")


class EngineCore:
    """Continuous batching over ``executor``; ``eos_token_ids`` end a request unless it ignores EOS."""

    def __init__(self, executor: Executor, eos_token_ids=(), vocab_size: int | None = None):
        self.executor = executor
        self.config = executor.config
        self.max_model_len = executor.max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.limits = RequestLimits(self.max_model_len, vocab_size, self.config.max_logprobs)
        self.pool = BlockPool(executor.num_blocks, executor.block_size, self.config.enable_prefix_caching,
                              getattr(self.config, "prefix_cache_eviction", "lru"))
        # hybrid KV specs: the sliding group's pool (same block size, same prefix-cache hashes), freed behind
        # ``executor.sliding_window`` by the scheduler
        n_sliding = getattr(executor, "num_sliding_blocks", None)
        self.sliding_pool = None if n_sliding is None else BlockPool(
            n_sliding, executor.block_size, self.config.enable_prefix_caching,
            getattr(self.config, "prefix_cache_eviction", "lru"))
        self.scheduler = Scheduler(self.config, self.pool, self.max_model_len, self.sliding_pool,
                                   executor.sliding_window if n_sliding is not None else 0)
        if getattr(self.config, "graph_prefill_alone", True):
            self.scheduler.lone_prefill_tokens = int(getattr(executor, "prefill_graph_tokens", 0))
        self._inflight: tuple[SchedulerOutput, StepHandle, int] | None = None  # async: launched, unapplied (+ index)
        self._steps = 0
        self._max_seqs = self._max_tokens = 0
        self._computed_tokens = self._gen_tokens = 0
        self._finished = self._aborted = 0
        self.record_shapes = False  # set by the step log: keep ``last_shape`` of each scheduled batch
        self.last_shape: StepShape | None = None
        # Index (``stats().num_steps`` at launch) of the batch the last ``step()`` launched / whose result it applied;
        # None when it launched / applied nothing. Equal in the synchronous engine; the previous launch under async.
        self.last_launched: int | None = None
        self.last_resolved: int | None = None
        # with ``record_shapes``, async scheduling only: seconds the last step spent scheduling + launching its
        # batch, and blocked on the previous batch's result (the device's share: what the step log records)
        self.last_launch_s: float | None = None
        self.last_wait_s: float | None = None
        # Prompt logprobs computed so far, sent with the request's first output (prompt_logprobs requests only).
        self._prompt_lps: dict[str, list[TokenLogprob]] = {}

    # ------------------------------------------------------------------ requests
    def add_request(self, request: EngineCoreRequest, hold_kv: bool = False) -> None:
        """Queue a request (validated by the caller with ``validate_request``). ``hold_kv`` (prefill role of a
        disaggregated pair): when it finishes, its blocks stay held until ``scheduler.release_held``."""
        req = self.make_request(request)
        req.hold_kv = hold_kv
        self.scheduler.add_request(req)

    def make_request(self, request: EngineCoreRequest) -> Request:
        """The scheduler's ``Request`` for ``request`` (stop ids: its own plus EOS unless it ignores EOS)."""
        params = request.sampling_params
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        req = Request(request.request_id, request.prompt_token_ids, params, frozenset(stop))
        if request.arrival_time is not None:
            req.arrival_time = request.arrival_time
        return req

    def finish_requests(self, request_ids, status: str = "abort") -> int:
        """Finish live requests now and free their blocks: ``"abort"``, or ``"stop"`` for a stop string the
        caller found in the text. Unknown or already finished ids are ignored. Returns how many finished."""
        st = RequestStatus.FINISHED_ABORTED if status == "abort" else RequestStatus.FINISHED_STOPPED
        n = 0
        for rid in request_ids:
            self._prompt_lps.pop(rid, None)
            if self.scheduler.finish_request(rid, st) is not None:
                n += 1
        if st is RequestStatus.FINISHED_ABORTED:
            self._aborted += n
        else:
            self._finished += n
        return n

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[EngineCoreOutput]:
        if self.config.async_scheduling:
            return self._step_async()
        self.last_launched = self.last_resolved = None
        if not self.scheduler.has_unfinished():
            return []
        sched = self._schedule()
        if sched.scheduled:
            self.last_launched = self.last_resolved = self._steps
        return self._apply(sched, self.executor.execute(sched))

    def _step_async(self) -> list[EngineCoreOutput]:
        """Launch step k, then apply step k-1 while the device runs step k (module docstring)."""
        timed = self.record_shapes
        t0 = time.perf_counter() if timed else 0.0
        launched = None
        if self.scheduler.has_unfinished():
            sched = self._schedule()
            handle = self.executor.execute_async(sched)  # every SchedulerOutput reaches the executor, in order
            if sched.scheduled:
                launched = (sched, handle, self._steps)
        prev, self._inflight = self._inflight, launched
        self.last_launched = launched[2] if launched is not None else None
        self.last_resolved = prev[2] if prev is not None else None
        t1 = time.perf_counter() if timed else 0.0
        out = None if prev is None else prev[1].result()  # blocks until step k-1's device work and copy are done
        if timed:
            self.last_launch_s = t1 - t0
            self.last_wait_s = None if prev is None else time.perf_counter() - t1
        return [] if prev is None else self._apply(prev[0], out)

    def _schedule(self) -> SchedulerOutput:
        sched = self.scheduler.schedule()
        if (not sched.scheduled and not self.scheduler.running and not sched.preempted_ids
                and not self.scheduler.held and not self.scheduler.reserved):
            # Nothing in flight can free blocks either: its requests are running, finished or preempted
            # (held / reserved blocks of a disaggregated pair are freed by their transfers).
            raise RuntimeError("scheduler made no progress: the KV pool cannot hold the next waiting request")
        self._steps += 1
        if self.record_shapes:
            self.last_shape = step_shape(sched, self.scheduler.num_running, self.scheduler.num_waiting)
        if sched.scheduled:
            num_tokens = sched.total_num_tokens
            self._max_seqs = max(self._max_seqs, sched.num_seqs)
            self._max_tokens = max(self._max_tokens, num_tokens)
            self._computed_tokens += num_tokens
        return sched

    def _apply(self, sched: SchedulerOutput, runner_out: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Apply one step's sampled tokens to the scheduler; one output per request that sampled."""
        outputs = []
        lps = runner_out.logprobs
        for rid, plps in runner_out.prompt_logprobs.items():
            self._prompt_lps.setdefault(rid, []).extend(plps)
        for res in self.scheduler.update_from_output(sched, runner_out):
            req = res.request
            self._gen_tokens += len(res.new_token_ids)
            reason = stop_reason = None
            if res.finished:
                reason = req.status.finish_reason
                stop_reason = req.stop_reason if req.status is RequestStatus.FINISHED_STOPPED else None
                self._finished += 1
            lp = [lps[req.request_id]] if req.sampling_params.logprobs is not None else None
            plp = None
            if req.sampling_params.prompt_logprobs is not None and req.num_output_tokens == len(res.new_token_ids):
                plp = self._prompt_lps.pop(req.request_id, [])  # complete: the prompt's last chunk sampled
            outputs.append(EngineCoreOutput(req.request_id, res.new_token_ids, reason, stop_reason,
                                            req.num_cached_tokens, lp, plp))
        return outputs

    # ------------------------------------------------------------------ introspection
    def cached_prefix_tokens(self, prompt_token_ids: list[int]) -> int:
        """How many leading tokens of a prompt are in the prefix cache (no side effects)."""
        hashes = hash_token_blocks(prompt_token_ids, self.pool.block_size)
        hit = self.pool.lookup(hashes)
        if hit and self.sliding_pool is not None:
            req = Request("", list(prompt_token_ids), None, block_hashes=hashes)
            hit = self.scheduler.sliding_hit(req, hit)[0]
        return len(hit) * self.pool.block_size

    def load(self) -> int:
        """Requests in flight (running + waiting): the router's load measure."""
        return self.scheduler.num_running + self.scheduler.num_waiting

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
        if self.sliding_pool is not None:
            self.sliding_pool.reset_prefix_cache()

    def stats(self) -> EngineStats:
        p, sp = self.pool, self.sliding_pool
        return EngineStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            kv_usage=p.usage if sp is None else max(p.usage, sp.usage),
            num_blocks=p.num_blocks, block_size=p.block_size, num_free_blocks=p.num_free,
            num_cached_blocks=p.num_cached_blocks, prefix_queries=p.prefix_queries, prefix_hits=p.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions, num_forward_calls=self.executor.num_forward_calls,
            num_steps=self._steps, max_batch_seqs=self._max_seqs, max_batch_tokens=self._max_tokens,
            num_computed_tokens=self._computed_tokens, num_generated_tokens=self._gen_tokens,
            num_finished=self._finished, num_aborted=self._aborted, num_graph_steps=self.executor.num_graph_steps,
            num_sliding_blocks=0 if sp is None else sp.num_blocks, num_free_sliding_blocks=0 if sp is None else sp.num_free,
        )

    def describe(self) -> str:
        return self.executor.describe()
