"""Replaying a served run's arrivals at the engine core (``sim.arrival_replay``, ``sim-validate --replay-arrivals``)."""

import json
import math

import pytest

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.engine.step_log import StepLog, step_log_meta
from torchinferno.errors import ConfigError
from torchinferno.sim.arrival_replay import core_timeline, replay_delays
from torchinferno.sim.cost_model import CostModel
from torchinferno.sim.driver import Replica, run_workload
from torchinferno.sim.executor import SimulatedExecutor
from torchinferno.sim.traffic import TrafficSpec, generate

COST = CostModel(c0=2e-3, coef={"seqs": 1e-5, "prefill_tokens": 4e-5, "decode_ctx": 2e-7})


def _executor(async_scheduling=False, max_num_seqs=8, budget=256):
    return SimulatedExecutor(COST, EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                                async_scheduling=async_scheduling), num_blocks=1024, max_model_len=1024)


class _Recorder:
    """A replica whose core's steps are logged as the core process logs them (``arrivals``: requests added since
    the previous step), and whose additions are kept as ``(request id, time)``."""

    def __init__(self, path, ex):
        self.core = EngineCore(ex)
        self.core.record_shapes = True
        self.log = StepLog(str(path), step_log_meta(self.core))
        self.log._t0 = 0.0  # rows on the virtual clock (the core process logs perf_counter offsets)
        self.rep = Replica(self.core, ex.clock, "r")
        self.added, self.pending, self.idle = [], 0, 0.0
        add = self.rep.add

        def counting_add(rid, prompt, max_tokens, t, external=False):
            if not self.rep.has_work():
                self.idle = 1e-6  # the core process would have been waiting for this request
            add(rid, prompt, max_tokens, t, external)
            self.added.append((rid, t))
            self.pending += 1

        def hook(t0, t1):
            idle, self.idle = self.idle, 0.0
            self.log.record(t0, t1, self.core.last_shape, 0, idle, self.core.last_launched, self.core.last_resolved,
                            self.pending)
            self.core.last_shape = None
            self.pending = 0

        self.rep.add = counting_add
        self.rep.step_hook = hook


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_inferred_arrivals_match_the_recorded_ones(tmp_path, async_scheduling):
    """A log without the ``arrivals`` field (run 37's) gives the same per-request arrival and finish times from
    the scheduler's queues, chunked prompts (budget 256 < prompts up to 300) and a full waiting queue included."""
    rec = _Recorder(tmp_path / "steps.jsonl", _executor(async_scheduling))
    reqs = generate(TrafficSpec(num_requests=40, prompt_len="uniform:8:300", output_len="uniform:2:40", seed=3,
                                rate=200.0, burstiness=0.3))
    run_workload(reqs, [rec.rep], max_concurrency=12)
    rec.log.close()
    full = core_timeline(tmp_path / "steps.jsonl")
    assert not full.inferred and len(full.arrivals) == 40
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join([lines[0]] + [json.dumps({k: v for k, v in json.loads(ln).items() if k != "arrivals"})
                                           for ln in lines[1:]]) + "\n")
    inferred = core_timeline(old)
    assert inferred.inferred
    assert inferred.arrivals == full.arrivals
    assert inferred.finishes == full.finishes[:len(inferred.finishes)] and len(inferred.finishes) >= 38
    # every request is placed no earlier than the step before the one that took it, and not after that one
    rows = [json.loads(ln) for ln in lines[1:]]
    starts = [r["t"] for r in rows]
    for (_, t_true), t_log in zip(rec.added, full.arrivals):
        k = min(i for i, s in enumerate(starts) if s >= t_true - 2e-6)  # the log keeps microseconds
        assert starts[max(0, k - 1)] - 2e-6 <= t_log <= starts[k] + 2e-6


def _synthetic_log(path, times, budget=4096):
    """A hand-written log: one request reaching an idle core at each of ``times``, served alone (prefill of 16
    tokens, then it finishes after one decode), as ``serve --step-log`` would write it."""
    meta = {"meta": {"step_log_version": 2, "async_scheduling": False, "block_size": 16, "num_blocks": 64,
                     "max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": budget}}
    rows = []
    for t in times:
        rows.append({"t": t, "dt": 1e-3, "gap": 0.0, "idle": 0.5, "arrivals": 1, "seqs": 1, "tokens": 16,
                     "decode_seqs": 0, "prefill_tokens": 16, "running": 1, "waiting": 0})
        rows.append({"t": t + 2e-3, "dt": 1e-3, "gap": 0.0, "idle": 0.0, "arrivals": 0, "seqs": 1, "tokens": 1,
                     "decode_seqs": 1, "prefill_tokens": 0, "running": 1, "waiting": 0})
    rows.append({"t": times[-1] + 1.0, "dt": 1e-3, "gap": 0.0, "idle": 0.5, "arrivals": 0})  # a row without shape
    path.write_text("\n".join(json.dumps(r) for r in [meta, *rows]) + "\n")


def test_replayed_requests_reach_the_real_scheduler_at_the_recorded_times(tmp_path):
    """An open-loop burst (all sent at t=0) whose requests the logged server took at 0, 0.05, 0.12 and 0.3 s: the
    simulator's real Scheduler receives each at that offset on the virtual clock and serves it from then on."""
    times = [10.0, 10.05, 10.12, 10.3]
    _synthetic_log(tmp_path / "s.jsonl", times)
    tl = core_timeline(tmp_path / "s.jsonl")
    # a finish shows in the next shaped row's queues: the last one is past the log's end
    assert tl.arrivals == times and tl.finishes == pytest.approx([t + 3e-3 for t in times[:-1]])
    doc = {"input_lens": [16] * 4, "output_lens": [2] * 4, "max_concurrency": None, "num_warmups": 0}
    (delays,) = replay_delays(tl, [doc], [[0.0] * 4])
    assert delays == pytest.approx([0.0, 0.05, 0.12, 0.3])
    ex = _executor()
    core = EngineCore(ex)
    rep = Replica(core, ex.clock, "r")
    seen = []
    add = rep.add

    def spy(rid, prompt, max_tokens, t, external=False):
        add(rid, prompt, max_tokens, t, external)
        seen.append((rid, t, ex.clock.now(), core.load()))

    rep.add = spy
    reqs = generate(TrafficSpec(num_requests=4, prompt_len="fixed:16", output_len="fixed:2", seed=0))
    res = run_workload(reqs, [rep], entry_delays={r.request_id: d for r, d in zip(reqs, delays)})
    assert [t for _, t, _, _ in seen] == pytest.approx([0.0, 0.05, 0.12, 0.3])
    assert all(now <= t + 1e-12 and n >= 1 for _, t, now, n in seen)  # in the scheduler, clock not past the entry
    by_id = {r.request_id: r for r in res.records}
    for rid, t, _, _ in seen:
        assert by_id[rid].send_s == 0.0 and by_id[rid].first_s > t  # TTFT counts from the client's send
    # without the replay the whole burst reaches the core at once
    ex2 = _executor()
    base = run_workload(reqs, [Replica(EngineCore(ex2), ex2.clock, "r")])
    assert max(r.first_s for r in base.records) < 0.05 < max(r.first_s for r in res.records)


def test_closed_loop_refills_follow_the_simulated_finishes(tmp_path):
    """At concurrency 1 a request's delay counts from the core finish of the one before it: the logged server took
    each next request 4 ms after the previous finished, and so does the simulator, on its own (different) clock."""
    times = [0.0]
    for _ in range(3):
        times.append(times[-1] + 3e-3 + 4e-3)
    _synthetic_log(tmp_path / "s.jsonl", times)
    doc = {"input_lens": [16] * 4, "output_lens": [2] * 4, "max_concurrency": 1, "num_warmups": 0}
    (delays,) = replay_delays(core_timeline(tmp_path / "s.jsonl"), [doc], [[0.0] * 4])
    assert delays[1:] == pytest.approx([4e-3] * 3) and delays[0] == pytest.approx(4e-3)  # first: uncontended
    ex = _executor()
    reqs = generate(TrafficSpec(num_requests=4, prompt_len="fixed:16", output_len="fixed:2", seed=0))
    res = run_workload(reqs, [Replica(EngineCore(ex), ex.clock, "r")], max_concurrency=1,
                       entry_delays={r.request_id: d for r, d in zip(reqs, delays)})
    recs = sorted(res.records, key=lambda r: r.send_s)
    for prev, nxt in zip(recs, recs[1:]):
        assert nxt.send_s == pytest.approx(prev.finish_s)
        assert nxt.first_s - nxt.send_s > 4e-3  # the replayed admission is inside the TTFT


def test_counts_that_do_not_add_up_are_named(tmp_path):
    _synthetic_log(tmp_path / "s.jsonl", [0.0, 1.0])
    doc = {"input_lens": [16] * 3, "output_lens": [2] * 3, "max_concurrency": 1, "num_warmups": 0}
    with pytest.raises(ConfigError, match="holds 2 requests, the results 3"):
        replay_delays(core_timeline(tmp_path / "s.jsonl"), [doc], [[0.0] * 3])
    with pytest.raises(ConfigError, match="not found"):
        core_timeline(tmp_path / "missing.jsonl")
    assert math.isfinite(core_timeline(tmp_path / "s.jsonl").arrivals[0])


def test_api_stage_fitted_from_recorded_arrivals(tmp_path):
    """A 'served' run whose API stage costs 1 ms per admission and 20 us per streamed token (the simulator's FIFO
    stage in front of a logged core) at concurrency 4 and 16: fitting the stage to the log's arrival delays
    recovers both from the grid, and no latency (sim-calibrate --api-model gaps). A latency shorter than the step
    is not identifiable from a core log (the core takes a request at its next step either way)."""
    from torchinferno.sim.fit_api_gaps import fit_api_from_arrivals
    from torchinferno.sim.step_log_fit import calibration_from_step_logs

    ex = _executor(max_num_seqs=16, budget=2048)
    rec = _Recorder(tmp_path / "steps.jsonl", ex)
    results = []
    for c in (4, 16):
        reqs = generate(TrafficSpec(num_requests=3 * c, prompt_len="fixed:64", output_len="fixed:8", seed=c))
        t0 = ex.clock.now() + 1.0  # levels one after another on the server's clock
        reqs = [type(r)(f"c{c}-{i}", t0 + r.arrival_s, r.prompt_token_ids, r.output_len) for i, r in enumerate(reqs)]
        run_workload(reqs, [rec.rep], max_concurrency=c, admission_s=1e-3, stream_s=20e-6)
        doc = {"input_lens": [64] * (3 * c), "output_lens": [8] * (3 * c), "max_concurrency": c, "num_warmups": 0,
               "request_rate": "inf", "burstiness": 1.0}
        results.append(str(tmp_path / f"bench_c{c}.json"))
        (tmp_path / f"bench_c{c}.json").write_text(json.dumps(doc))
    rec.log.close()
    cal = calibration_from_step_logs([str(tmp_path / "steps.jsonl")], log=lambda *_: None, cost_model="linear")
    cal.device = "cpu"  # the simulated executor's log names no device
    adm, stream, lat, err = fit_api_from_arrivals(cal, results, str(tmp_path / "steps.jsonl"), cost_model="linear")
    assert (adm, stream, lat) == (1e-3, 20e-6, 0.0), (adm, stream, lat, err)


def test_api_server_fit_recovers_event_and_token_costs(tmp_path):
    """sim.validate.fit_api_server with stream_coalesce: results whose figures come from an API stage of 1 ms an
    admission, 120 us an event and 40 us a token (in front of a logged core whose ~2.2 ms steps stream 16 requests at
    once: 2.6 ms of events, so the stage falls behind and coalesces) are fitted back to those costs; the per-token FIFO
    alone fits them worse."""
    from torchinferno.sim.step_log_fit import calibration_from_step_logs
    from torchinferno.sim.validate import _served_workload, fit_api_server, simulate_served

    ex = _executor(max_num_seqs=16, budget=2048)
    rec = _Recorder(tmp_path / "steps.jsonl", ex)
    docs = {}
    for c in (4, 16):
        reqs = generate(TrafficSpec(num_requests=3 * c, prompt_len="fixed:64", output_len="fixed:16", seed=c))
        t0 = ex.clock.now() + 1.0
        reqs = [type(r)(f"c{c}-{i}", t0 + r.arrival_s, r.prompt_token_ids, r.output_len) for i, r in enumerate(reqs)]
        run_workload(reqs, [rec.rep], max_concurrency=c)
        docs[c] = {"input_lens": [64] * (3 * c), "output_lens": [16] * (3 * c), "max_concurrency": c,
                   "num_warmups": 0, "request_rate": "inf", "burstiness": 1.0}
    rec.log.close()
    cal = calibration_from_step_logs([str(tmp_path / "steps.jsonl")], log=lambda *_: None, cost_model="linear")
    cal.device = "cpu"
    cal.extra["stream_coalesce"] = True
    results = []
    for c, doc in docs.items():  # "measured": the simulator's figures at the true costs
        path = tmp_path / f"bench_c{c}.json"
        path.write_text(json.dumps(doc))
        got = simulate_served(cal, doc, _served_workload(str(path), 0)[1], 1e-3, "linear", 120e-6, stream_token_s=40e-6)
        doc.update(output_throughput=got["output_throughput"], **{
            f"p{q}_{n}_ms": got[f"p{q}_{n}_s"] * 1e3 for q in ("50", "99") for n in ("ttft", "tpot")})
        path.write_text(json.dumps(doc))
        results.append(str(path))
    adm, event, err = fit_api_server(cal, results, cost_model="linear")
    assert (adm, event, cal.extra["stream_token_s"]) == (1e-3, 120e-6, 40e-6) and err < 1e-9, (adm, event, err)
    cal.extra["stream_coalesce"] = False
    assert fit_api_server(cal, results, cost_model="linear")[2] > 1e-3  # one cost per token cannot match them
