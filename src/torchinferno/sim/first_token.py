"""Following requests through a step log to their first token (issue 21), and the client's finish latency.

A step log has no request ids: requests are followed by counts, as ``sim.arrival_replay`` does (arrivals in order,
first prefill chunks scheduled first come first served, a prompt cut by the token budget continuing in the next
batch's first prefill row; exact without preemption). Under async scheduling a request's first token leaves at the
end of the iteration that takes the result of the batch holding its last prompt chunk (one iteration after that
batch's launch, after the next batch's host launch).

``fit_finish_latency``: a closed loop's refill is replayed from the core's finish of the request whose slot it took
(``arrival_replay``), so the replayed delay holds that request's *last* token's way to the client and the client's
turnaround, while the measured TTFT holds the *first* token's way. Their difference, read off a served run with
per-request TTFTs (bench-serve ``ttfts``), is ``driver.run_workload``'s ``finish_latency_s`` (run 45: ~1 ms).
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CoreRequest", "finish_latency_for", "fit_finish_latency", "follow_requests"]


@dataclass
class CoreRequest:
    arrival: float
    first_sched: float = float("nan")  # start of the iteration that launched its first prefill chunk
    prefill_end: float = float("nan")  # end of the iteration that launched its last chunk
    first_token: float = float("nan")  # end of the iteration that took that chunk's result
    last_step: object = None  # id of the batch holding its last chunk
    extra: dict = field(default_factory=dict)


def follow_requests(rows: list[dict], budget: int) -> list[CoreRequest]:
    """Per request (arrival order) core times from step-log-shaped rows: ``t``, ``dt``, ``gap``, ``idle``,
    ``arrival_times`` (list, or ``arrivals`` count placed as ``arrival_replay`` does), ``step``, ``resolved``, ``seqs``,
    ``decode_seqs``, ``prefill_tokens``, ``tokens``."""
    reqs: list[CoreRequest] = []
    waiting: deque[CoreRequest] = deque()
    by_last: dict = {}
    cut: CoreRequest | None = None  # a prompt the previous batch cut at the token budget
    prev, prev_wait = None, 0
    recorded = any("arrivals" in r or "arrival_times" in r for r in rows)
    for r in rows:
        start = r["t"] - max(0.0, (r.get("gap") or 0.0) - r.get("idle", 0.0))
        times = r.get("arrival_times")
        if times is None:
            if recorded:
                n = int(r.get("arrivals", 0))
            elif "running" in r:  # no arrivals field (run 37): inferred from the queues, as arrival_replay does
                n = int(r["seqs"]) - int(r["decode_seqs"]) - (1 if cut is not None else 0) + int(r["waiting"]) - prev_wait
            else:
                n = 0
            at = r["t"] if prev is None or r.get("idle", 0) > 0 else 0.5 * (prev["t"] + r["t"])
            times = [at] * n
        for a in times:
            req = CoreRequest(a)
            reqs.append(req)
            waiting.append(req)
        resolved = r.get("resolved")
        if resolved is not None:
            for req in by_last.pop(resolved, []):
                req.first_token = r["t"] + r["dt"]
                req.extra["ft_row"] = r
        step = r.get("step")
        if step is not None and "seqs" in r:
            n_pre = int(r["seqs"]) - int(r["decode_seqs"])
            sched: list[CoreRequest] = []
            if cut is not None and n_pre > 0:
                sched.append(cut)
                n_pre -= 1
            for _ in range(min(n_pre, len(waiting))):
                req = waiting.popleft()
                req.first_sched = start
                sched.append(req)
            filled = budget > 0 and int(r["tokens"]) >= budget and int(r["prefill_tokens"]) > 0
            cut = sched[-1] if filled and sched else None
            prev_wait = int(r.get("waiting", 0))
            for req in sched:
                if req is cut:
                    continue
                req.last_step = step
                req.prefill_end = r["t"] + r["dt"]
                req.extra["pre_row"] = r
                by_last.setdefault(step, []).append(req)
        prev = r
    return reqs


def fit_finish_latency(step_log: str, results: list[str], warmups: int | None = None) -> dict[int, float] | None:
    """Per concurrency level of ``results`` (bench-serve results of the run that wrote ``step_log``, in run order):
    the median over its closed-loop refills of (core: the released slot's finish -> the refill's first token) less
    (client: the refill's TTFT), i.e. the replayed delay less the measured API part of the TTFT (the core arrival
    time cancels), floored at 0. Run 45: ~1 ms at C 1, 2-4 at 16, 18-27 at 64, 27-51 at 256 (the last token's trip
    to the client grows with the streams the API server carries). None when the results keep no per-request TTFTs."""
    from torchinferno.sim.arrival_replay import core_timeline, level_warmups
    from torchinferno.sim.step_log_fit import read_step_log

    docs = [json.loads(Path(p).read_text()) for p in results]
    if not all(d.get("ttfts") for d in docs):
        return None
    meta, rows = read_step_log(step_log, for_fit=False)
    reqs = follow_requests(rows, int(meta.get("max_num_batched_tokens") or 0))
    finishes = core_timeline(step_log).finishes
    out, pos = {}, 0
    for d in docs:
        w, n = level_warmups(d, warmups), len(d["ttfts"])
        cap = int(d.get("max_concurrency") or 0) or n
        diffs = []
        for i in range(cap, n):
            j = pos + w + i - cap  # the finish that released refill i (arrival_replay's matching)
            first = reqs[pos + w + i].first_token
            if j < len(finishes) and first == first:
                diffs.append(first - finishes[j] - d["ttfts"][i])
        if diffs:
            out[cap] = max(0.0, statistics.median(diffs))
        pos += w + n
    return out or None


def finish_latency_for(table: dict | None, concurrency: int | None) -> float:
    """The fitted finish latency of the level nearest ``concurrency`` (0 without a table or a cap)."""
    if not table or not concurrency:
        return 0.0
    key = min(table, key=lambda c: abs(int(c) - int(concurrency)))
    return float(table[key])
