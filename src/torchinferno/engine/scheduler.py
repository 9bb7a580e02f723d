"""Continuous-batching scheduler over a paged KV block pool.

Each ``schedule()`` builds one step under two budgets, ``max_num_batched_tokens`` and
``max_num_seqs``:

1. running requests, decodes first, then in-progress prefill chunks. A request that needs a new
   block when none is free preempts the latest-arrived unscheduled running request (possibly
   itself): its blocks are freed and it goes back to the front of the waiting queue to be
   recomputed from prompt + generated tokens;
2. waiting requests in FCFS order (skipped in a step that preempted): each reuses the longest
   cached prefix of its tokens, then computes the rest, chunked to the remaining token budget.

Lone graph prefill (``lone_prefill_tokens > 0``, set by the engine core to the longest fresh prompt its runner
replays from a prefill graph when ``EngineConfig.graph_prefill_alone``): when exactly one request waits, it is new,
has no cached prefix, no prompt logprobs and at most that many tokens, the step is that prompt alone and the
running requests wait one step. A prefill graph replays it at a fraction of the host time of the eager step that
mixing it into the decodes would take (session 26, H100, 8B: 1.0 ms against 24-55 ms); several waiting prompts
still share one mixed step, where batching their prefill pays.

Scheduling a request advances its ``num_computed_tokens`` (the step's KV writes are launched
before anything that could read them) and, for a sampling row, its ``num_inflight``.
``update_from_output()`` consumes the runner's sampled tokens: appends them, applies token-level
stops (eos / stop_token_ids / max_tokens / max_model_len) and registers newly full blocks in the
prefix cache. Stop strings need text, so the engine reports them through ``finish_request``.
Only this class changes ``Request`` state.

Hybrid KV specs (``KVSpec.is_hybrid``, e.g. deepseek-v4): a second pool, ``sliding_pool``, holds the sliding
group's blocks, one per block of ``block_ids`` (``Request.sliding_block_ids``, allocated in lockstep;
``engine/sliding_group.py``). Before each ``schedule()`` every running request gives back the sliding blocks whose
tokens all lie before ``num_computed_tokens - window`` (-1 stays in their place; no forward reads them), so a
sequence holds about ``window / block_size + 1`` sliding blocks plus its current chunk. A prefix hit of ``k``
blocks needs all ``k`` whole-group blocks and the sliding blocks covering ``[k * block_size - window,
k * block_size)`` cached: the lookup takes the longest such ``k`` (a P/D decode side, which computes no prompt token,
needs only the blocks of its last window: ``reserve_prefilled``). Preemption frees both groups; recompute then
equals the full pass.

Async scheduling (``LLMEngine`` with ``async_scheduling``): step k is scheduled before step
k-1's result is applied, so a request may hold one in-flight token. It is counted in the
request's length (positions, slots, blocks) and scheduled as ``PLACEHOLDER_TOKEN``; the runner
fills it on the device. Invariants:

* at most one step is unapplied when ``schedule()`` runs, so ``num_inflight <= 1`` there;
* a request whose outputs + in-flight token already reach ``max_tokens`` / ``max_model_len`` is
  not scheduled: it finishes when the token arrives;
* a request preempted with a token in flight gets that token appended (and token-level stops
  applied) while WAITING; it cannot be re-admitted first, because a step that preempts admits
  nothing and the in-flight result is applied before the next ``schedule()``;
* results for requests finished meanwhile (abort, stop string, a stop token of the previous
  step) are dropped, also when the request id was reused (``arrival_index`` differs);
* blocks freed while a launched step may still write them (abort, stop, preemption) are safe:
  device work is stream-ordered, and any step that reuses them is launched later.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from torchinferno.cache.block_pool import BlockPool, cdiv, hash_token_blocks
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.outputs import PLACEHOLDER_TOKEN, ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from torchinferno.engine.request import Request, RequestStatus
from torchinferno.engine.scheduler_handoff import HandoffMixin
from torchinferno.engine.scheduler_lone import LonePrefillMixin
from torchinferno.engine.sliding_group import SlidingGroup

__all__ = ["Scheduler", "StepResult"]


@dataclass
class StepResult:
    """A request that produced a token this step (or finished); input to the output processor."""

    request: Request
    new_token_ids: list[int]
    finished: bool


class Scheduler(HandoffMixin, LonePrefillMixin):
    """Owns the waiting queue, the running set and every block-table change."""

    def __init__(self, config: EngineConfig, pool: BlockPool, max_model_len: int,
                 sliding_pool: BlockPool | None = None, window: int = 0):
        if (sliding_pool is None) != (window <= 0):
            raise ValueError("a sliding pool needs a window > 0 and the other way round")
        if sliding_pool is not None and sliding_pool.block_size != pool.block_size:
            raise ValueError("the sliding pool must use the whole pool's block size")
        self.sliding = None if sliding_pool is None else SlidingGroup(sliding_pool, window)
        self.config = config
        self.pool = pool
        self.block_size = pool.block_size
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        self._arrivals = itertools.count()
        self.num_preemptions = 0
        # Prefill/decode disaggregation (disagg/). ``held``: finished requests (prefill role, ``hold_kv``) whose
        # blocks stay referenced until ``release_held``; ``reserved``: requests whose KV is being received into
        # blocks allocated by ``reserve_prefilled`` (decode role), not yet running.
        self.held: dict[str, Request] = {}
        self.reserved: dict[str, Request] = {}
        self.lone_prefill_tokens = 0  # > 0: a lone waiting prompt this long or shorter runs alone (module docstring)
        self.num_lone_prefills = 0

    # ------------------------------------------------------------------ queue management
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        request.arrival_index = next(self._arrivals)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        policy = self.config.scheduling_policy
        if policy == "fcfs":
            self.waiting.append(request)
            return
        key = self._order_key(request)
        for i, other in enumerate(self.waiting):  # before the first waiting (not preempted) request that sorts later
            if other.status == RequestStatus.WAITING and self._order_key(other) > key:
                self.waiting.insert(i, request)
                return
        self.waiting.append(request)

    def _order_key(self, req: Request) -> tuple:
        if self.config.scheduling_policy == "sjf":
            return (req.num_prompt_tokens, req.arrival_index)
        return (req.sampling_params.priority, req.arrival_index)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Finish a live request (abort, stop string); frees its blocks. None if unknown/finished."""
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return None
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._finish(req, status)
        return req

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        if req.hold_kv and status is not RequestStatus.FINISHED_ABORTED and req.block_ids:
            self.held[req.request_id] = req  # blocks stay referenced (and cached) until release_held
        else:
            self._free_blocks(req)
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)

    def _free_blocks(self, req: Request) -> None:
        # Tail first: when these blocks are evicted later, the shareable head goes last.
        self.pool.free(reversed(req.block_ids))
        req.block_ids = []
        req.num_registered_blocks = 0
        if self.sliding is not None:
            self.sliding.free_all(req)

    @property
    def sliding_pool(self) -> BlockPool | None:
        """The sliding group's pool (hybrid KV specs), else None."""
        return None if self.sliding is None else self.sliding.pool

    def _fits(self, need: int) -> bool:
        """``need`` fresh blocks are free in every pool."""
        return need <= self.pool.num_free and (self.sliding is None or need <= self.sliding.pool.num_free)

    def _allocate(self, req: Request, need: int) -> list[int]:
        """Append ``need`` fresh blocks to every group of ``req``; -> the whole group's new ids."""
        new = self.pool.allocate(need) if need else []
        req.block_ids.extend(new)
        if self.sliding is not None:
            self.sliding.extend(req, need)
        return new

    def sliding_hit(self, req: Request, hit: list[int]) -> tuple[list[int], list[int], int]:
        """``SlidingGroup.trim_hit`` (hybrid KV specs only)."""
        return self.sliding.trim_hit(req, hit)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free_blocks(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ block helpers
    def _ensure_hashes(self, req: Request, num_tokens: int) -> None:
        """Extend ``req.block_hashes`` to cover the full blocks among the first ``num_tokens``."""
        have = len(req.block_hashes)
        want = num_tokens // self.block_size
        if want > have:
            parent = req.block_hashes[-1] if have else None
            toks = req.token_slice(0, want * self.block_size)
            req.block_hashes.extend(hash_token_blocks(toks, self.block_size, start=have, parent_hash=parent))

    def _register_full_blocks(self, req: Request) -> None:
        """Offer full blocks whose tokens are known and whose KV is written or being written by a
        launched step to the prefix cache (a later reader is launched after that step)."""
        if not self.pool.enable_prefix_caching:
            return
        full = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        if full <= req.num_registered_blocks:
            return
        self._ensure_hashes(req, full * self.block_size)
        sg = self.sliding
        for i in range(req.num_registered_blocks, full):
            self.pool.cache_block(req.block_ids[i], req.block_hashes[i])
            if sg is not None:  # unless given back before it was registered
                sg.register(req, i)
        req.num_registered_blocks = full

    def _blocks_needed(self, req: Request, num_new: int) -> int:
        return max(0, cdiv(req.num_computed_tokens + num_new, self.block_size) - len(req.block_ids))

    def _ends_with_inflight(self, req: Request) -> bool:
        """The in-flight token will finish ``req`` by length: nothing more to schedule for it."""
        n = req.num_inflight
        return (req.num_output_tokens + n >= req.sampling_params.max_tokens
                or req.num_tokens + n >= self.max_model_len)

    # ------------------------------------------------------------------ schedule
    def _prefix_hit(self, req: Request) -> list[int]:
        """Cached blocks of ``req``'s longest cached prefix (never the block holding its last token)."""
        if not self.pool.enable_prefix_caching or req.sampling_params.prompt_logprobs is not None:
            return []
        max_hit = (req.num_tokens - 1) // self.block_size
        self._ensure_hashes(req, max_hit * self.block_size)
        return self.pool.lookup(req.block_hashes[:max_hit])

    def _admit(self, req: Request, hit: list[int], need: int, num_new: int) -> ScheduledRequest:
        """Move ``req`` (popped from the waiting queue) to running over the cached blocks ``hit`` and ``need`` fresh
        ones; -> its first step's work, ``num_new`` tokens."""
        self.pool.touch(hit)
        req.block_ids = list(hit)
        new_blocks = self._allocate(req, need)
        num_cached = len(hit) * self.block_size
        req.num_computed_tokens = num_cached
        req.num_registered_blocks = len(hit)
        if req.status == RequestStatus.WAITING:
            req.num_cached_tokens = num_cached
        self.pool.record_prefix_query(req.num_tokens, num_cached)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        return self._scheduled(req, num_new, new_blocks)

    def schedule(self) -> SchedulerOutput:
        if self.lone_prefill_tokens > 0:
            lone = self._lone_prefill()
            if lone is not None:
                return lone
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        decodes: list[ScheduledRequest] = []
        prefills: list[ScheduledRequest] = []
        preempted: list[str] = []

        if self.sliding is not None:
            for req in self.running:
                self.sliding.slide(req)
        # 1. Running requests: decodes (one token) first, then continuing prefill chunks.
        order = sorted(self.running,
                       key=lambda r: (r.num_tokens + r.num_inflight - r.num_computed_tokens > 1, r.arrival_index))
        pending = deque(order)
        while pending and budget > 0:
            req = pending.popleft()
            if req.num_inflight and self._ends_with_inflight(req):
                continue
            num_new = req.num_tokens + req.num_inflight - req.num_computed_tokens
            if num_new > budget:
                if not cfg.enable_chunked_prefill:
                    continue
                num_new = budget
            need = self._blocks_needed(req, num_new)
            while need and not self._fits(need):
                # Preempt the latest arrival among those not yet scheduled this step.
                victim = max([req, *pending], key=lambda r: r.arrival_index)
                if victim is not req:
                    pending.remove(victim)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                continue
            new_blocks = self._allocate(req, need)
            is_decode = num_new == 1 and req.num_computed_tokens >= req.num_prompt_tokens
            (decodes if is_decode else prefills).append(self._scheduled(req, num_new, new_blocks))
            budget -= num_new

        # 2. Waiting requests (FCFS); none in a step that had to preempt.
        while self.waiting and budget > 0 and not preempted and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            if req.num_inflight:
                raise RuntimeError(f"request {req.request_id!r} would be admitted with a token in flight "
                                   "(more than one step in flight?)")
            hit = self._prefix_hit(req)
            shit: list[int] = []
            j0 = 0
            if hit and self.sliding is not None:
                hit, shit, j0 = self.sliding.trim_hit(req, hit)
            num_cached = len(hit) * self.block_size
            num_new = req.num_tokens - num_cached
            if num_new > budget:
                if not cfg.enable_chunked_prefill:
                    break
                num_new = budget
            need = cdiv(num_cached + num_new, self.block_size) - len(hit)
            if need + self.pool.num_reclaimed_by(hit) > self.pool.num_free or (
                    self.sliding is not None and not self.sliding.has_room(need, shit)):
                break  # wait for running requests to free blocks
            self.waiting.popleft()
            if self.sliding is not None:
                self.sliding.admit(req, shit, j0)
            prefills.append(self._admit(req, hit, need, num_new))
            budget -= num_new

        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(scheduled=decodes + prefills, preempted_ids=preempted, finished_ids=finished)

    def _scheduled(self, req: Request, num_new: int, new_blocks: list[int]) -> ScheduledRequest:
        """The step's work for ``req``; advances ``num_computed_tokens`` (and ``num_inflight``)."""
        start = req.num_computed_tokens
        stop = start + num_new
        known = req.num_tokens
        if stop <= known:
            tokens = req.token_slice(start, stop)
        else:  # the in-flight token: only ever a decode of it (a sampling step reached the end)
            if req.num_inflight != 1 or start != known:
                raise RuntimeError(f"request {req.request_id!r}: cannot schedule tokens {start}..{stop} with "
                                   f"{known} known and {req.num_inflight} in flight")
            tokens = [PLACEHOLDER_TOKEN]
        sample = stop == known + req.num_inflight
        req.num_computed_tokens = stop
        if sample:
            req.num_inflight += 1
        plp_start, plp_targets = 0, None
        if req.sampling_params.prompt_logprobs is not None:
            # Position p predicts prompt token p + 1: positions max(start, done) .. min(stop, P - 1) - 1.
            lo, hi = max(start, req.num_prompt_logprobs), min(stop, req.num_prompt_tokens - 1)
            if hi > lo:
                plp_start, plp_targets = lo, req.prompt_token_ids[lo + 1 : hi + 1]
                req.num_prompt_logprobs = hi
        # Positional (field order of ScheduledRequest): this runs once per request per step.
        return ScheduledRequest(
            req.request_id,
            tokens,  # token_ids
            start,  # num_computed_tokens
            list(req.block_ids),  # block_ids: a snapshot, the request's list keeps growing
            new_blocks,  # new_block_ids: a fresh list from the pool, not aliased by the request
            sample,
            req.sampling_params,
            req.arrival_index,
            plp_start,
            plp_targets,
            req.num_prior_draws,
            None if self.sliding is None else list(req.sliding_block_ids),
        )

    # ------------------------------------------------------------------ results
    def update_from_output(self, sched: SchedulerOutput, out: ModelRunnerOutput) -> list[StepResult]:
        """Apply the result of ``sched`` (steps are applied in the order they were scheduled)."""
        results: list[StepResult] = []
        sampled = out.sampled_token_ids
        running = RequestStatus.RUNNING
        for s in sched.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.arrival_index != s.arrival_index:
                continue  # finished after scheduling (its id may be in use again): drop the result
            if not s.sample:
                if req.status is running:
                    self._register_full_blocks(req)
                continue
            # Sampled: applied even if the request was preempted since (async scheduling).
            req.num_inflight -= 1
            tok = sampled[s.request_id]
            outs = req.output_token_ids
            outs.append(tok)
            if req.status is running:  # before a finish frees the blocks: they stay cached
                self._register_full_blocks(req)
            status = None
            if tok in req.stop_token_ids:
                status, req.stop_reason = RequestStatus.FINISHED_STOPPED, tok
            elif (len(outs) >= req.sampling_params.max_tokens
                  or len(req.prompt_token_ids) + len(outs) >= self.max_model_len):
                status = RequestStatus.FINISHED_LENGTH
            if status is not None:
                (self.running if req.status is running else self.waiting).remove(req)
                self._finish(req, status)
            results.append(StepResult(req, [tok], status is not None))
        return results
