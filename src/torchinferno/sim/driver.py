"""Event loop driving a workload into engine replicas, and the serving metrics of the run.

One loop serves both sides of a validation: replicas on a ``VirtualClock`` (``SimulatedExecutor``) and one
real engine on a ``WallClock`` (``UniprocExecutor``). Events are taken in time order: a client request is
sent at ``max(arrival, the time a concurrency slot freed)``; the replica with the earliest clock that has
work runs one ``EngineCore.step()`` (its clock advances by the step's cost); an idle replica's clock jumps
to the arrival it receives. Outputs of a step are stamped with the replica's clock after the step.

Metrics (as bench-serve reports them): TTFT = first token - send; TPOT = (last - first) / (tokens - 1);
ITL = gaps between a request's token times; throughput = output tokens / (last finish - first send).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.core import EngineCore, validate_request
from torchinferno.engine.core_types import EngineCoreRequest
from torchinferno.errors import ConfigError
from torchinferno.sim.traffic import SimRequest

__all__ = ["Replica", "RequestRecord", "RunResult", "percentile", "run_workload", "summarize"]


class Replica:
    """One engine core and its clock. ``external_prefill``: the executor's set of requests whose prompt KV was
    transferred in (P/D decode side); None for executors without one (the real engine)."""

    def __init__(self, core: EngineCore, clock, name: str = "r0", role: str = "both", priorities: dict | None = None):
        self.core = core
        self.priorities = priorities or {}  # request id -> SamplingParams.priority (scheduling_policy="priority")
        self.clock = clock
        self.name = name
        self.role = role  # "both" | "prefill" | "decode"
        self.external_prefill = getattr(core.executor, "external_prefill", None)
        self.num_added = 0
        self.step_hook = None  # called as hook(t_before, t_after) around every step (sim-calibrate)

    def now(self) -> float:
        return self.clock.now()

    def has_work(self) -> bool:
        return self.core.has_unfinished()

    def load(self) -> int:
        return self.core.load()

    def add(self, rid: str, prompt: list[int], max_tokens: int, t: float, external: bool = False) -> None:
        if not self.has_work():
            self.clock.advance_to(t)
        if external:
            if self.external_prefill is None:
                raise ConfigError(f"replica {self.name} cannot take transferred KV")
            self.external_prefill.add(rid)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                                priority=self.priorities.get(rid, 0))
        try:
            validate_request(self.core.limits, prompt, params)
        except ConfigError as e:
            raise ConfigError(f"request {rid} on replica {self.name}: {e}") from None
        self.core.add_request(EngineCoreRequest(rid, prompt, params, t))
        self.num_added += 1

    def step(self) -> tuple[float, list]:
        hook = self.step_hook
        t0 = self.clock.now() if hook is not None else 0.0
        outs = self.core.step()
        if hook is not None:
            hook(t0, self.clock.now())
        if self.external_prefill:
            for o in outs:
                if o.finish_reason is not None:
                    self.external_prefill.discard(o.request_id)
        return self.clock.now(), outs


@dataclass
class RequestRecord:
    request_id: str
    prompt_len: int
    output_len: int
    arrival_s: float
    send_s: float = math.nan
    first_s: float = math.nan
    last_s: float = math.nan
    finish_s: float = math.nan
    num_tokens: int = 0
    itls: list = field(default_factory=list)
    replica: str = ""
    entry_s: float = math.nan  # when it reached the (first) engine core
    core_finish_s: float = math.nan  # when the core finished it (finish_s: when the client had its last token)


@dataclass
class RunResult:
    records: list[RequestRecord]
    replicas: list[Replica]
    num_steps: int

    def summary(self) -> dict:
        return summarize(self.records)


def percentile(xs: list[float], q: float) -> float:
    """numpy's (linear) percentile, NaN for no values."""
    return float(np.percentile(xs, q)) if xs else math.nan


def summarize(records: list[RequestRecord]) -> dict:
    """bench-serve-shaped figures (seconds) of finished records."""
    done = [r for r in records if not math.isnan(r.finish_s)]
    if not done:
        raise ConfigError("no request finished")
    ttft = [r.first_s - r.send_s for r in done]
    tpot = [(r.last_s - r.first_s) / (r.num_tokens - 1) for r in done if r.num_tokens > 1]
    itl = [x for r in done for x in r.itls]
    e2e = [r.finish_s - r.send_s for r in done]
    start = min(r.send_s for r in done)
    dur = max(r.finish_s for r in done) - start
    out_tok = sum(r.num_tokens for r in done)
    res = {"completed": len(done), "duration_s": dur, "total_output_tokens": out_tok,
           "total_input_tokens": sum(r.prompt_len for r in done),
           "request_throughput": len(done) / dur if dur > 0 else math.inf,
           "output_throughput": out_tok / dur if dur > 0 else math.inf}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2e)):
        res[f"mean_{name}_s"] = sum(xs) / len(xs) if xs else math.nan
        for q in (50, 90, 99):
            res[f"p{q}_{name}_s"] = percentile(xs, q)
    return res


def run_workload(requests: list[SimRequest], replicas: list[Replica], router=None, *,
                 max_concurrency: int | None = None, transfer=None, max_steps: int | None = None,
                 admission_s: float = 0.0, stream_s: float = 0.0, entry_delays: dict | None = None,
                 latency_s: float = 0.0, finish_latency_s: float = 0.0, stream_coalesce: bool = False,
                 stream_token_s: float = 0.0) -> RunResult:
    """Serve ``requests`` on ``replicas`` (module docstring). ``router(req, candidates) -> Replica`` picks among
    the replicas that take new requests (default: the first). P/D: when some replicas have role ``prefill``,
    a request is prefilled there (one token), then moved to a ``decode`` replica after ``transfer(req)``
    seconds, where its prompt KV costs nothing to compute. ``admission_s``: the API server in front admits one
    request at a time and spends this long on each (HTTP, validation, tokenization, the hop to the core), so a
    burst of sends reaches the core spread out; 0 = requests reach the core when sent. ``stream_s``: the same API
    server spends this long on each output token it streams back (detokenize, SSE, write); tokens reach the client
    when it is done with them, and admissions and tokens share its time in arrival order (one FIFO server).
    ``latency_s``: a pure delay (network, the client's turnaround; nothing queues on it) before a request reaches
    that server. ``entry_delays`` (request id -> seconds; ``sim.arrival_replay``): replayed admission instead of ``admission_s``:
    a request reaches the core that long after the event that released it, i.e. its send for the first
    ``max_concurrency`` requests (send order), else the core-side finish of the request whose slot it took (the
    ``(i - max_concurrency)``-th finish); never before its send. ``finish_latency_s``: the client holds a request
    finished (and sends the next one into its slot) this long after its last token was streamed: the last token's
    trip (finish reason, ``[DONE]``) beyond a first token's, plus the client's turnaround (``sim.first_token``).
    ``stream_coalesce``: ``stream_s`` is spent per streamed event, not per token, and tokens a request produces while
    its previous event still waits in that FIFO go out with it (one SSE event of several tokens, as a server behind
    on streaming sends them: run 53's C 256 streamed 128 tokens in 76-87 events a request, mean).
    ``stream_token_s``: each token also costs this much beside its event's ``stream_s`` (detokenizing, bytes); with
    ``stream_coalesce`` the tokens that join a queued event too: their time is added to the FIFO behind it."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ConfigError(f"max concurrency must be >= 1, got {max_concurrency}")
    entry = [r for r in replicas if r.role in ("both", "prefill")]
    decoders = [r for r in replicas if r.role == "decode"]
    if not entry:
        raise ConfigError("no replica takes new requests (roles: both or prefill)")
    disagg = any(r.role == "prefill" for r in replicas)
    if disagg and not decoders:
        raise ConfigError("prefill replicas need at least one decode replica")
    pick = router or (lambda req, cands: cands[0])
    pending = deque(sorted(requests, key=lambda r: r.arrival_s))
    by_id = {r.request_id: r for r in requests}
    recs = {r.request_id: RequestRecord(r.request_id, r.prompt_len, r.output_len, r.arrival_s) for r in requests}
    moves: list = []  # heap of (time, seq, request_id, first_token): KV on its way to a decode replica
    admits: list = []  # heap of (time, seq, request_id): requests the API server is still admitting
    admit_free = -math.inf  # when the API server is done with the requests sent so far
    inflight, gate, steps, seq = 0, -math.inf, 0, 0
    cap = max_concurrency or math.inf
    finish_core: list[float] = []  # core-side finish time of every finished request, in finish order (replay)
    queued_event: dict[str, float] = {}  # stream_coalesce: request -> when the API server sends its queued event
    sent = 0

    def enter(req, t: float) -> None:
        rep = pick(req, entry)
        recs[req.request_id].replica = rep.name
        recs[req.request_id].entry_s = t
        rep.add(req.request_id, req.prompt_token_ids, 1 if rep.role == "prefill" else req.output_len, t)

    while True:
        t_send = max(pending[0].arrival_s, gate) if pending and inflight < cap else math.inf
        t_admit = admits[0][0] if admits else math.inf
        t_move = moves[0][0] if moves else math.inf
        busy = None
        for r in replicas:
            if r.has_work() and (busy is None or r.now() < busy.now()):
                busy = r
        t_step = busy.now() if busy is not None else math.inf
        t = min(t_send, t_admit, t_move, t_step)
        if t == math.inf:
            break
        if t_send == t and t_send <= t_step:
            req = pending.popleft()
            recs[req.request_id].send_s = t
            inflight += 1
            sent += 1
            if entry_delays is not None:
                i = sent - 1
                ref = finish_core[i - cap] if i >= cap else t  # i >= cap: finish i - cap freed its slot
                seq += 1
                heapq.heappush(admits, (max(t, ref + entry_delays.get(req.request_id, 0.0)), seq, req.request_id))
            elif admission_s > 0 or latency_s > 0:
                admit_free = max(admit_free, t + latency_s) + admission_s
                seq += 1
                heapq.heappush(admits, (admit_free, seq, req.request_id))
            else:
                enter(req, t)
        elif t_admit == t and t_admit <= t_step:
            _, _, rid = heapq.heappop(admits)
            enter(by_id[rid], t)
        elif t_move == t and t_move <= t_step:
            _, _, rid, tok = heapq.heappop(moves)
            req = by_id[rid]
            rep = pick(req, decoders)
            recs[rid].replica += f">{rep.name}"
            rep.add(rid, req.prompt_token_ids + [tok], req.output_len - 1, t, external=True)
        else:
            now, outs = busy.step()
            step_end = now
            steps += 1
            if max_steps is not None and steps > max_steps:
                raise RuntimeError(f"simulation exceeded {max_steps} steps")
            for o in outs:
                rec = recs[o.request_id]
                n = len(o.new_token_ids)
                if (stream_s > 0 or stream_token_s > 0) and n:  # the API server delivers them after what it holds
                    if stream_coalesce and queued_event.get(o.request_id, -math.inf) > step_end:
                        now = queued_event[o.request_id]  # rides along with the event still queued
                        admit_free += stream_token_s * n  # its tokens' own cost: work behind that event
                    else:
                        # one event of n tokens, or (no coalescing) n events of one token each
                        cost = stream_s + stream_token_s * n if stream_coalesce else (stream_s + stream_token_s) * n
                        admit_free = max(admit_free, step_end) + cost
                        now = admit_free
                        if stream_coalesce:
                            queued_event[o.request_id] = now
                if n:
                    if rec.num_tokens == 0:
                        rec.first_s = now
                    else:
                        rec.itls.append(now - rec.last_s)
                    rec.last_s = now
                    rec.num_tokens += n
                if o.finish_reason is None:
                    continue
                if busy.role == "prefill" and rec.num_tokens < rec.output_len:
                    seq += 1
                    heapq.heappush(moves, (now + transfer(by_id[o.request_id]), seq, o.request_id,
                                           o.new_token_ids[-1] if o.new_token_ids else 0))
                    continue
                rec.finish_s = now + finish_latency_s
                rec.core_finish_s = step_end
                finish_core.append(step_end)
                if inflight >= cap:
                    gate = rec.finish_s
                inflight -= 1
    return RunResult(list(recs.values()), replicas, steps)
