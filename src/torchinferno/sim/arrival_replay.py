"""Replaying when a served run's requests reached the engine core (``sim-validate --replay-arrivals STEP_LOG``).

A bench-serve client measures TTFT from its send; the request reaches the engine core later (HTTP, parsing,
tokenization, the hop to the core), and a burst of sends reaches it spread out (run 37: a wave of 256 over
~50-370 ms). The step log (``serve --step-log``) tells when requests reached the core:

* version-2 logs with an ``arrivals`` field: that many requests were received by the core's loop just before the
  row's step;
* older logs (run 37) lack it; the count is inferred from the scheduler's queues: requests whose first prefill
  chunk this step scheduled (prefill rows less one continued chunk when the previous step filled the token budget)
  plus the growth of the waiting queue. Exact without preemption (a preempted request re-prefilled counts twice)
  unless a budget-filling step's last chunk ends exactly at its prompt's end (one arrival is then placed late).

A request counted at row ``k`` landed on the core's socket after the loop last polled (just before row ``k-1``'s
step) and was taken just before row ``k``'s: its arrival time is the middle of ``[t(k-1), t(k)]``, or ``t(k)`` when
the core was idle waiting for it (``idle > 0``). Finishes come from the same queues: ``finished = arrived -
(running + waiting)``; growth seen at row ``k`` happened when row ``k-1``'s step returned its outputs.

``replay_delays`` turns that into one delay per request of each bench-serve result, measured from the event that
released the request in the client's loop (invariant: delays >= 0):

* the first ``max_concurrency`` requests (all of them without a cap): from the level's start, i.e. its first
  request's arrival less ``first_delay`` (a single request's admission: the median of the run's refill delays),
  less the request's scheduled send offset (open-loop rates);
* a later request ``i``: from the core finish of the level's ``(i - cap)``-th finishing request (the closed loop
  sends it when a slot frees), so the delay holds the last token's trip to the client, the client's turnaround and
  the admission.

The simulator (``driver.run_workload(entry_delays=...)``) applies each delay to its own release events, so the
replayed admission follows the simulated engine's timing; the client's send (what TTFT counts from) stays the
simulated closed loop's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from torchinferno.errors import ConfigError

__all__ = ["CoreTimeline", "StepRecorder", "core_timeline", "level_warmups", "replay_delays", "timeline_from_rows"]


@dataclass
class CoreTimeline:
    """Per-request core events of a step log, in order: ``arrivals[i]`` (seconds on the log's clock) of the i-th
    request the core received, ``finishes[j]`` of the j-th request it finished; ``inferred``: counts came from the
    scheduler's queues (no ``arrivals`` field)."""

    arrivals: list[float]
    finishes: list[float]
    inferred: bool


def core_timeline(path: str | Path) -> CoreTimeline:
    """Arrival and finish times of every request in a served run's step log (module docstring)."""
    from torchinferno.sim.step_log_fit import read_step_log

    meta, rows = read_step_log(path, for_fit=False)
    return timeline_from_rows(meta, rows, str(path))


def timeline_from_rows(meta: dict, rows: list[dict], name: str = "step log") -> CoreTimeline:
    """``core_timeline`` of a log already read (``meta``: its first line's ``meta``; ``rows``: the step lines)."""
    budget = int(meta.get("max_num_batched_tokens") or 0)
    recorded = any("arrivals" in r for r in rows)
    arrivals: list[float] = []
    finishes: list[float] = []
    prev_cut, prev_wait, total, prev = False, 0, 0, None
    for r in rows:
        has_shape = "running" in r
        if recorded:
            n = int(r.get("arrivals", 0))
        elif has_shape:
            pre_rows = int(r["seqs"]) - int(r["decode_seqs"])
            n = pre_rows - (1 if prev_cut else 0) + int(r["waiting"]) - prev_wait
            prev_cut = budget > 0 and int(r["tokens"]) >= budget and int(r["prefill_tokens"]) > 0
        else:
            n = 0
        if n < 0:
            raise ConfigError(f"{name}: cannot infer arrivals at t={r['t']} (queues shrank without finishes: "
                              "preemption?); record them with a newer serve --step-log")
        if n:
            t = r["t"] if prev is None or r.get("idle", 0) > 0 else 0.5 * (prev["t"] + r["t"])
            arrivals += [t] * n
            total += n
        if has_shape:
            prev_wait = int(r["waiting"])
            done = total - int(r["running"]) - int(r["waiting"])
            if done > len(finishes):
                t_fin = prev["t"] + prev["dt"] if prev is not None else r["t"]
                finishes += [t_fin] * (done - len(finishes))
        prev = r
    if not arrivals:
        raise ConfigError(f"{name}: the step log records no requests")
    return CoreTimeline(arrivals, finishes, not recorded)


def level_warmups(doc: dict, default: int | None) -> int:
    """Warm-up requests bench-serve sent before a result's timed requests: the result's ``num_warmups`` when it
    records one, else ``default`` (None: ``min(2, max_concurrency)``, what benchmarks/served_sim_validate.py uses)."""
    if "num_warmups" in doc:
        return int(doc["num_warmups"])
    if default is not None:
        return default
    return min(2, int(doc.get("max_concurrency") or 2))


def replay_delays(timeline: CoreTimeline, docs: list[dict], send_offsets: list[list[float]],
                  warmups: int | None = None) -> list[list[float]]:
    """One delay per request (in send order) for each bench-serve result of ``docs`` (in the order they were run
    against the logged server; ``send_offsets``: each request's scheduled send time from the level's start, 0 for
    an unlimited rate). The log's requests are matched by order: each level's warm-ups, then its timed requests.
    Raises ConfigError when the counts do not add up."""
    expected = [(level_warmups(d, warmups), int(d.get("completed") or len(d["input_lens"]))) for d in docs]
    need = sum(w + n for w, n in expected)
    if need != len(timeline.arrivals):
        raise ConfigError(f"the step log holds {len(timeline.arrivals)} requests, the results {need} "
                          f"(warm-ups + timed: {expected}); pass the results in run order and the right warm-up count")
    medians = []  # per level: the median closed-loop delay (first_delay)
    spans = []
    start = 0
    for (w, n), d in zip(expected, docs):
        spans.append((start + w, n, d))
        cap = int(d.get("max_concurrency") or 0) or n
        refill = []
        for i in range(cap, n):
            j = start + w + i - cap  # the finish (in finish order) that released i: earlier requests all finished
            if j < len(timeline.finishes):
                refill.append(timeline.arrivals[start + w + i] - timeline.finishes[j])
        if refill:
            medians.append(statistics.median(refill))
        start += w + n
    first_delay = max(0.0, min(medians)) if medians else 0.0
    out = []
    for (lo, n, d), offs in zip(spans, send_offsets):
        cap = int(d.get("max_concurrency") or 0) or n
        arr = timeline.arrivals[lo:lo + n]
        t0 = arr[0] - first_delay
        delays = []
        for i, a in enumerate(arr):
            if i < cap:
                ref = t0 + (offs[i] if i < len(offs) else 0.0)
            else:
                j = lo + i - cap
                if j >= len(timeline.finishes):
                    raise ConfigError(f"step log: request {j} never finished, cannot replay the closed loop")
                ref = timeline.finishes[j]
            delays.append(max(0.0, a - ref))
        out.append(delays)
    return out


class StepRecorder:
    """Rows as ``serve --step-log`` writes them (``t``, ``dt``, ``idle``, ``arrivals`` and the batch's shape),
    collected in memory from a simulated ``driver.Replica`` on its virtual clock: a simulated run's arrivals are
    then read by ``timeline_from_rows`` exactly as a served run's are."""

    def __init__(self, replica):
        from dataclasses import asdict

        self.rows: list[dict] = []
        self.meta = {"max_num_batched_tokens": replica.core.scheduler.config.max_num_batched_tokens}
        core = replica.core
        core.record_shapes = True
        add = replica.add
        pending, idle = [0], [0.0]

        def counting_add(rid, prompt, max_tokens, t, external=False):
            if not replica.has_work():
                idle[0] = 1e-6  # the core process would have been waiting for this request
            add(rid, prompt, max_tokens, t, external)
            pending[0] += 1

        def hook(t0, t1):
            row = {"t": t0, "dt": t1 - t0, "idle": idle[0], "arrivals": pending[0]}
            if core.last_shape is not None:
                row.update(asdict(core.last_shape))
            self.rows.append(row)
            core.last_shape = None
            pending[0], idle[0] = 0, 0.0

        replica.add = counting_add
        replica.step_hook = hook
