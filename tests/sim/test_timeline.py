"""The timeline cost model (sim.timeline): overlap semantics, the simulated executor under it, and the fit
(sim.timeline_fit) recovering known parameters from synthetic step logs."""

import math
import random

import pytest

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.errors import ConfigError
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.cost_model import CostModel
from torchinferno.sim.driver import Replica, run_workload
from torchinferno.sim.executor import SimulatedExecutor
from timeline_logs import EngineLoop, one_second_steps  # tests/sim/timeline_logs.py (pytest puts this folder on sys.path)
from torchinferno.sim.timeline import BatchShape, Timeline, TimelineModel
from torchinferno.sim.timeline_fit import Iteration, fit_timeline, iterations_from_step_log, replay_periods
from torchinferno.sim.traffic import SimRequest

MS = 1e-3
GPU = dict(host_step=0.3 * MS, host_seq=0.004 * MS, host_token=0.002 * MS, launch_eager=12 * MS,
           launch_graph=0.2 * MS, apply_row=0.01 * MS, weights=4 * MS, kv_token=2e-5 * MS,
           flop_token=0.02 * MS, token=0.001 * MS, attn_pair=0.03 * MS)


def dec(rows, ctx):
    return BatchShape(rows, rows, rows, 0, rows * ctx, ctx, 0.0)


def pre(tokens, rows=1, decode_rows=0, ctx=0):
    return BatchShape(rows + decode_rows, tokens + decode_rows, decode_rows, tokens, decode_rows * ctx, ctx,
                      tokens * tokens / rows * 0.5e-3)


def test_parts_and_roofline():
    m = TimelineModel(GPU, graphs=True, overlap=True)
    p, launch, d, a = m.parts(dec(1, 100))
    assert launch == GPU["launch_graph"] and a == pytest.approx(0.01 * MS)
    assert d == pytest.approx(4 * MS + 100 * 2e-5 * MS + 0.001 * MS)  # memory-bound
    _, launch, d, _ = m.parts(pre(1000))
    assert launch == GPU["launch_eager"]
    assert d == pytest.approx(1000 * 0.02 * MS + 1000 * 0.001 * MS + 500 * 0.03 * MS)  # compute-bound: 20 > 4 ms
    with pytest.raises(ConfigError):
        TimelineModel({"bogus": 1.0})
    assert TimelineModel.from_dict(m.as_dict()).params == m.params


def test_overlap_order():
    """Async order by hand: step 2's launch runs on the host while step 1's device work runs."""
    m = TimelineModel(dict(host_step=1.0, launch_graph=1.0, launch_eager=3.0, weights=10.0, apply_row=0.5),
                      graphs=True, overlap=True)
    t = Timeline(m)
    s1 = dec(1, 10)
    end1 = t.launch(0.0, s1)  # host 0 -> 2; graph: device 2 -> 12
    assert (end1, t.last_device_end) == (2.0, 12.0)
    d1 = t.last_device_end
    end2 = t.launch(end1, s1)  # host 2 -> 4 (overlaps step 1's device); device waits for step 1: 12 -> 22
    assert (end2, t.last_device_end) == (4.0, 22.0)
    assert t.resolve(end2, d1, s1) == 12.5  # waits for step 1's device, then applies one row
    e = t.launch(12.5, pre(4))  # eager: kernels run from max(device free 22, 12.5 + 1) = 22 -> 32
    assert (e, t.last_device_end) == (16.5, 32.0)
    # no overlap (a CPU): the host does the device work; sync period = sum of the parts
    cpu = TimelineModel(dict(host_step=1.0, launch_eager=3.0, weights=10.0, apply_row=0.5))
    assert cpu.step_seconds(dec(2, 5)) == pytest.approx(1 + 3 + 10 + 1.0)


def _serve(model, async_scheduling, n_out=6):
    cfg = EngineConfig(async_scheduling=async_scheduling, max_num_seqs=8, max_num_batched_tokens=64)
    ex = SimulatedExecutor(model, cfg, num_blocks=64, device="cpu")
    reqs = [SimRequest("r0", 0.0, list(range(1, 17)), n_out)]
    res = run_workload(reqs, [Replica(EngineCore(ex), ex.clock)])
    return res.records[0]


def test_executor_sync_and_async():
    m = TimelineModel(dict(host_step=1.0, launch_graph=1.0, launch_eager=5.0, weights=10.0, apply_row=0.5),
                      graphs=True, overlap=True)
    r = _serve(m, False)
    # sync: prefill = 1 + 5 (host) + device 10 (eager, from t=1, ends >= 6) -> 11, + apply 0.5
    assert r.first_s == pytest.approx(11.5)
    assert (r.last_s - r.first_s) / 5 == pytest.approx(1 + 1 + 10 + 0.5)  # graph decode: launch then device
    a = _serve(m, True)
    # async: the prefill's result is taken by the next step, whose launch (2 s) overlaps the prefill's device
    assert a.first_s == pytest.approx(11.5)
    assert (a.last_s - a.first_s) / 5 == pytest.approx(10.0)  # device-bound: decode launches hide behind it
    lin = _serve(CostModel(c0=1.0), False)  # the linear model still runs
    assert lin.first_s == pytest.approx(1.0)


def _synthetic(model: TimelineModel, seed: int = 0, longest: int = 4096) -> list[Iteration]:
    """An async engine's loop under ``model``: bursts of prefills (of up to ``longest`` tokens) among decode batches
    of 1-256 rows, idle gaps between bursts (drained launches), loop overhead before steps."""
    rng = random.Random(seed)
    loop = EngineLoop(model, rng)
    for _burst in range(24):
        loop.idle(rng.uniform(0.05, 0.2))  # idle: nothing in flight
        rows = rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256])
        shapes = [pre(rng.randrange(16, longest), rows=rng.randrange(1, 32), decode_rows=rng.randrange(0, rows),
                      ctx=rng.randrange(16, 512))]
        shapes += [dec(rows, rng.randrange(16, 2048)) for _ in range(rng.randrange(3, 12))]
        if rng.random() < 0.5:
            shapes.insert(3, pre(rng.randrange(16, longest // 2), rows=rng.randrange(1, 8), decode_rows=rows, ctx=300))
        loop.burst(shapes, (0, 0.05))
    return loop.its


def test_fit_recovers_synthetic_parameters():
    truth = TimelineModel(GPU, graphs=True, overlap=True, async_scheduling=True)
    its = _synthetic(truth)
    got, err = fit_timeline(its, graphs=True, overlap=True, weights="time")
    assert err < 0.02
    pred, true = replay_periods(its, got), replay_periods(its, truth)
    assert all(abs(p - q) <= 0.02 * q for p, q in zip(pred, true))
    for k in ("launch_eager", "weights", "flop_token", "attn_pair"):  # what sets TTFT and TPOT
        assert got.params[k] == pytest.approx(GPU[k], rel=0.02), k


def test_fit_from_step_log_rows_and_calibration():
    """Step-log rows -> iterations (busy gap counts, idle does not); two logs do not share a device."""
    rows = [{"t": 1.0, "dt": 0.02, "gap": None, "idle": 0.0, "step": 1, "resolved": None, "seqs": 1, "tokens": 64,
             "decode_seqs": 0, "prefill_tokens": 64, "prefill_attn": 2.048},
            {"t": 1.021, "dt": 0.004, "gap": 0.001, "idle": 0.0, "step": 2, "resolved": 1, "seqs": 1, "tokens": 1,
             "decode_seqs": 1, "prefill_tokens": 0, "decode_ctx": 65, "decode_ctx_max": 65},
            {"t": 1.03, "dt": 0.004, "gap": 0.005, "idle": 0.004, "step": None, "resolved": 2}]
    its = iterations_from_step_log(rows)
    assert its[1].start == pytest.approx(1.02) and its[2].start == pytest.approx(1.029)
    both = iterations_from_step_log(rows, its)
    assert len(both) == 6 and both[3].start > its[-1].end and both[3].launched != its[0].launched
    cal = Calibration(cost=CostModel(c0=1.0), timeline=TimelineModel(GPU).as_dict())
    assert isinstance(cal.model_for("auto"), TimelineModel) and isinstance(cal.model_for("linear"), CostModel)
    assert isinstance(Calibration.from_dict(cal.to_dict()).model_for(), TimelineModel)
    with pytest.raises(ConfigError):
        Calibration(cost=CostModel()).model_for("timeline")


def test_validate_tiny_cpu_model_with_timeline(tmp_path):
    """sim-calibrate probes fit a timeline too (a synchronous CPU engine); sim-validate --cost-model timeline runs it
    against the real engine. No accuracy bound: a shared 2-core host (docs/SIMULATION.md has the figures)."""
    import json

    from torchinferno.cli.main import main

    cal = tmp_path / "calib.json"
    base = ["--model-kind", "llama3", "--dtype", "float32", "--threads", "1", "--max-model-len", "128"]
    assert main(["sim-calibrate", *base, "--context-lens", "16 64", "--batch-sizes", "1 4", "--decode-steps", "6",
                 "--out", str(cal)]) == 0
    d = json.loads(cal.read_text())
    assert d["timeline"]["kind"] == "timeline" and not d["timeline"]["overlap"]
    v = tmp_path / "v.json"
    assert main(["sim-validate", *base, "--calibration", str(cal), "--concurrency", "1", "4", "--requests", "6",
                 "--input-len", "uniform:16:48", "--output-len", "uniform:4:12", "--cost-model", "timeline",
                 "--json-output", str(v)]) == 0
    res = json.loads(v.read_text())
    for lv in res["levels"].values():
        for f in lv["figures"].values():
            assert 0 < f["predicted"] < float("inf") and 0 < f["measured"] < float("inf")
    with pytest.raises(SystemExit):
        main(["sim-validate", "--bench-results", str(v), "--calibration", str(cal), "--cost-model", "bogus"])


def test_api_server_fifo_delays_tokens():
    """driver.run_workload(stream_s=...): tokens reach the client after the API server streamed them."""
    plain, fifo = one_second_steps(2, 3, stream_s=0.0), one_second_steps(2, 3, stream_s=0.25)
    assert [r.first_s for r in plain] == [1.0, 1.0]
    assert [r.first_s for r in fifo] == [1.25, 1.5]  # one server: the second request's token waits for the first
    assert fifo[1].last_s == pytest.approx(3.5)


def test_api_server_coalesces_tokens_of_a_queued_event():
    """stream_coalesce: a server behind on streaming sends a request's newer tokens with its still-queued event (cost
    per event), so it keeps up with the engine where the per-token FIFO falls ever further behind."""
    fifo, coal = (one_second_steps(4, 6, stream_s=0.3, stream_coalesce=c) for c in (False, True))
    assert [r.first_s for r in coal] == [r.first_s for r in fifo] == pytest.approx([1.3, 1.6, 1.9, 2.2])  # first events
    assert max(r.last_s for r in fifo) == pytest.approx(1.0 + 0.3 * 24)  # 24 tokens, one at a time
    assert max(r.last_s for r in coal) < max(r.last_s for r in fifo) - 1.0  # later tokens ride along (7.0 vs 8.2)
    assert all(r.num_tokens == 6 for r in coal) and any(itl == 0.0 for r in coal for itl in r.itls)


def test_api_server_prices_events_and_their_tokens():
    """stream_token_s (with stream_coalesce): an event costs stream_s plus stream_token_s per token, and the tokens
    that join a queued event add their cost behind it (the next event waits for them)."""
    one = one_second_steps(1, 3, stream_s=0.1, stream_coalesce=True, stream_token_s=0.05)
    assert one[0].first_s == pytest.approx(1.15) and one[0].last_s == pytest.approx(3.15)
    base, priced = (one_second_steps(4, 6, stream_s=0.3, stream_coalesce=True, stream_token_s=t) for t in (0.0, 0.1))
    assert [r.first_s for r in priced] == pytest.approx([1.4, 1.8, 2.2, 2.6])  # 0.3 + 0.1 an event of one token
    assert max(r.last_s for r in priced) > max(r.last_s for r in base) + 0.5  # joined tokens cost time (7.7 vs 7.0)


def test_fit_recovers_host_batched_step():
    """Run 37's decode-step shape (issue 21): a host-bound graph step that costs ``host_batched`` more from two rows
    on (4.1 ms at 1 row, 4.9 at 2, ~10 at 256). The fit recovers the term and prices the 16-row step."""
    host_bound = dict(host_token=0.01 * MS, host_batched=0.6 * MS, launch_eager=15 * MS, launch_graph=4 * MS,
                      apply_row=0.01 * MS, weights=0.2 * MS, token=0.015 * MS, attn_pair=0.03 * MS)
    truth = TimelineModel(host_bound, graphs=True, overlap=True, async_scheduling=True)
    its = _synthetic(truth, seed=1)
    got, err = fit_timeline(its, graphs=True, overlap=True, weights="time")
    assert err < 0.02
    assert got.params["host_batched"] == pytest.approx(host_bound["host_batched"], rel=0.05)
    for rows in (1, 2, 16, 256):
        assert got.step_seconds(dec(rows, 200)) == pytest.approx(truth.step_seconds(dec(rows, 200)), rel=0.02), rows
    without = dict(got.params, host_batched=0.0)  # the term matters: dropping it misprices 16 rows by > 10%
    assert TimelineModel(without, graphs=True, overlap=True).step_seconds(dec(16, 200)) \
        < 0.9 * truth.step_seconds(dec(16, 200))


def test_a_term_no_step_exercises_stays_zero():
    """An eager engine's steps never replay a graph: the fit must leave ``launch_graph`` at 0 through its random
    restarts (a restart used to start it at median / 1e-30, a value no row corrects: a CPU calibration of session
    18 wrote 2.8e16 ms, pricing any later graph step at that). Seeds 2 and 3 hit it before the fix."""
    truth = TimelineModel(GPU, graphs=False, overlap=True, async_scheduling=True)
    for seed, overlap in ((2, True), (3, False)):
        got, _ = fit_timeline(_synthetic(truth, seed=seed), graphs=False, overlap=overlap, weights="time", restarts=6,
                              seed=seed)
        assert got.params["launch_graph"] == 0.0
        assert all(math.isfinite(v) and v < 1.0 for v in got.params.values()), got.params  # seconds


def _sched(*reqs):
    """A SchedulerOutput of (tokens, computed) requests; one-token rows past a prefix are decodes."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.outputs import ScheduledRequest, SchedulerOutput

    return SchedulerOutput([ScheduledRequest(f"r{i}", [5] * n, c, [1] * 64, [], True, SamplingParams())
                            for i, (n, c) in enumerate(reqs)])


@pytest.mark.parametrize("reqs, graphed", [
    ([(128, 0)], True),  # one fresh prompt
    ([(512, 0)], True), ([(513, 0)], False),  # past the longest captured length
    ([(1, 0)], True),  # a one-token fresh prompt (the decode graph takes it in the engine)
    ([(128, 16)], False),  # a prefix-cache hit: cached context
    ([(64, 0), (64, 0)], False),  # two prompts
    ([(1, 40), (64, 0)], False),  # a prompt beside a decode
    ([(1, 40), (1, 7)], True),  # pure decode
])
def test_graph_step_is_the_runner_rule(reqs, graphed):
    """The simulator's rule (sim.timeline.graph_step on the batch shape) is the engine runner's
    (ModelRunner.graph_prefillable / the decode graphs' pure-decode batches) for the same scheduled batch."""
    from types import SimpleNamespace

    from torchinferno.engine.model_runner import ModelRunner
    from torchinferno.sim.timeline import batch_shape, graph_step, piecewise_step

    sched = _sched(*reqs)
    runner = SimpleNamespace(prefill_graphs=SimpleNamespace(max_tokens=512))
    decode = all(len(s.token_ids) == 1 and s.num_computed_tokens > 0 for s in sched.scheduled)
    engine = decode or (len(sched.scheduled) == 1 and len(sched.scheduled[0].token_ids) == 1) \
        or ModelRunner.graph_prefillable(runner, sched.scheduled)
    shape = batch_shape(sched)
    assert graph_step(shape, True, 512) == engine == graphed
    assert graph_step(shape, True, 0) == decode  # prefill graphs off: decode batches only
    assert not graph_step(shape, False, 512)
    # every other step of at most the piecewise limit runs piecewise (ModelRunner._hidden's rule)
    tokens = sum(n for n, _ in reqs)
    assert piecewise_step(shape, True, 512) == (tokens <= 512)
    assert not piecewise_step(shape, True, 0) and not piecewise_step(shape, False, 512)


def test_a_graphed_prefill_pays_the_graph_launch():
    """With prefill graphs a fresh prompt's step pays launch_graph and starts on the device after it; the model's
    dict form keeps the length (older files: 0)."""
    eager = TimelineModel(GPU, graphs=True, overlap=True)
    graphed = TimelineModel(GPU, graphs=True, overlap=True, prefill_graph_tokens=512)
    s = pre(128)
    assert eager.parts(s)[1] == GPU["launch_eager"] and graphed.parts(s)[1] == GPU["launch_graph"]
    assert graphed.step_seconds(s) < eager.step_seconds(s) - 5 * MS  # the 12 ms launch hid ~4.6 ms of device work
    assert graphed.step_seconds(pre(1024)) == eager.step_seconds(pre(1024))  # past the captured lengths: eager
    assert TimelineModel.from_dict(graphed.as_dict()).prefill_graph_tokens == 512
    d = graphed.as_dict()
    del d["prefill_graph_tokens"]
    assert TimelineModel.from_dict(d).prefill_graph_tokens == 0


def test_a_piecewise_step_pays_the_piecewise_launch():
    """On a graph engine with piecewise graphs, a mixed step of at most the limit pays launch_piecewise (+ its per-row
    term), longer ones the eager launch, pure decodes the graph launch; the dict form keeps the limit (older: 0)."""
    params = dict(GPU, launch_piecewise=2 * MS, launch_piecewise_seq=0.01 * MS)
    pw = TimelineModel(params, graphs=True, overlap=True, prefill_graph_tokens=512, piecewise_graph_tokens=512)
    mixed, big = pre(128, decode_rows=16, ctx=300), pre(1024, decode_rows=16, ctx=300)
    assert pw.parts(mixed)[1] == pytest.approx(2 * MS + 17 * 0.01 * MS)
    assert pw.parts(big)[1] == GPU["launch_eager"]
    assert pw.parts(dec(8, 100))[1] == GPU["launch_graph"] and pw.parts(pre(128))[1] == GPU["launch_graph"]
    eager = TimelineModel(params, graphs=True, overlap=True, prefill_graph_tokens=512)
    assert pw.step_seconds(mixed) < eager.step_seconds(mixed) - 5 * MS
    assert TimelineModel(params, graphs=False, piecewise_graph_tokens=512).parts(mixed)[1] == GPU["launch_eager"]
    d = pw.as_dict()
    assert TimelineModel.from_dict(d).piecewise_graph_tokens == 512
    del d["piecewise_graph_tokens"]
    assert TimelineModel.from_dict(d).piecewise_graph_tokens == 0


def test_whole_step_graphs_what_if_prices_mixed_steps_as_replays():
    """--cuda-graph-mixed-mode full: every step of at most the limit replays one graph (launch_graph, device after the
    launch), longer ones stay eager; ``with_mixed_graphs`` turns a piecewise engine's model into that one, the runner's
    rule (ModelRunner._hidden with a MixedGraphRunner) is graph_step's, and the dict form keeps the limit."""
    from torchinferno.sim.timeline import graph_step

    params = dict(GPU, launch_piecewise=9 * MS)
    pw = TimelineModel(params, graphs=True, overlap=True, prefill_graph_tokens=512, piecewise_graph_tokens=512)
    full = pw.with_mixed_graphs()
    assert (full.piecewise_graph_tokens, full.mixed_graph_tokens) == (0, 512)
    mixed, big = pre(128, decode_rows=16, ctx=300), pre(1024, decode_rows=16, ctx=300)
    assert not full.eager(mixed) and full.parts(mixed)[1] == GPU["launch_graph"]
    assert full.eager(big) and full.parts(big)[1] == GPU["launch_eager"]
    assert full.parts(mixed)[2] == pw.parts(mixed)[2]  # the same device work
    # 9 ms of launch (overlapping ~4.5 ms of device work that starts as launched) became a ~1 ms graph launch
    assert full.step_seconds(mixed) < pw.step_seconds(mixed) - 4 * MS
    assert graph_step(mixed, True, 0, 512) and not graph_step(mixed, True, 512, 0) and not graph_step(mixed, False, 0, 512)
    assert TimelineModel.from_dict(full.as_dict()).mixed_graph_tokens == 512
    d = full.as_dict()
    del d["mixed_graph_tokens"]
    assert TimelineModel.from_dict(d).mixed_graph_tokens == 0
    assert TimelineModel(params, graphs=True).with_mixed_graphs().mixed_graph_tokens == 0  # no piecewise steps: as is


def test_fit_of_a_whole_step_graph_engine():
    """An engine whose mixed steps replay whole graphs: the fit told so prices them at launch_graph and recovers the
    device terms behind them."""
    truth = TimelineModel(dict(GPU), graphs=True, overlap=True, async_scheduling=True, mixed_graph_tokens=512)
    its = _synthetic(truth, longest=4096)
    got, err = fit_timeline(its, graphs=True, overlap=True, weights="time", mixed_graph_tokens=512)
    assert err < 0.02 and got.mixed_graph_tokens == 512 and got.piecewise_graph_tokens == 0
    for k in ("launch_eager", "launch_graph", "weights", "flop_token"):
        assert got.params[k] == pytest.approx(truth.params[k], rel=0.05), k


@pytest.mark.parametrize("launch_ms, longest", [(6, 4096), (3, 4096), (1, 1024)])
def test_fit_recovers_the_piecewise_launch(launch_ms, longest):
    """A piecewise launch the device work does not hide (6 ms), hides for some steps (3 ms: without the damped steps
    the fit ended at 12% error with the prefill compute term at 0) or for most (1 ms). (3 ms with prompts of up to
    1,024 tokens, seed 0, still ends there: noted in docs/SIMULATION.md.)"""
    truth = TimelineModel(dict(GPU, launch_piecewise=launch_ms * MS), graphs=True, overlap=True, async_scheduling=True,
                          piecewise_graph_tokens=512)
    its = _synthetic(truth, longest=longest)
    got, err = fit_timeline(its, graphs=True, overlap=True, weights="time", piecewise_graph_tokens=512)
    assert err < 0.02 and got.piecewise_graph_tokens == 512
    for k in ("launch_eager", "launch_piecewise", "weights", "flop_token"):
        assert got.params[k] == pytest.approx(truth.params[k], rel=0.05), k
