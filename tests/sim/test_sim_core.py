"""The simulator runs the real scheduler on a virtual clock: deterministic, sensitive to scheduler knobs, fast,
and its cost model fit recovers known coefficients."""

import itertools
import math
import random
import time

import pytest

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.errors import ConfigError
from torchinferno.sim.cost_model import (
    FEATURES,
    CostModel,
    LinkModel,
    fit,
    step_features,
)
from torchinferno.sim.driver import Replica, run_workload
from torchinferno.sim.executor import SimulatedExecutor
from torchinferno.sim.traffic import LengthDist, TrafficSpec, arrival_times, generate

COST = CostModel(c0=5e-3, coef={"prefill_tokens": 2e-5, "decode_tokens": 1e-4, "decode_ctx": 1e-7})


def _sim(reqs, cost=COST, **cfg):
    ex = SimulatedExecutor(cost, EngineConfig(**cfg), num_blocks=cfg.pop("num_gpu_blocks", None) or 4096)
    rep = Replica(EngineCore(ex), ex.clock)
    return run_workload(reqs, [rep])


def _spec(n=200, **kw):
    return TrafficSpec(num_requests=n, rate=kw.pop("rate", 40.0), prompt_len="uniform:16:128",
                       output_len="uniform:8:64", **kw)


def test_same_seed_same_simulation_different_seed_differs():
    a = _sim(generate(_spec(seed=3))).summary()
    b = _sim(generate(_spec(seed=3))).summary()
    c = _sim(generate(_spec(seed=4))).summary()
    assert a == b
    assert a != c


def test_scheduler_knob_changes_the_simulation():
    reqs = generate(_spec(n=100, rate=math.inf))
    wide = _sim(reqs, max_num_seqs=64).summary()
    narrow = _sim(reqs, max_num_seqs=2).summary()
    # Two sequences at a time: requests queue, so time to first token grows and the run takes longer.
    assert narrow["p50_ttft_s"] > 5 * wide["p50_ttft_s"]
    assert narrow["duration_s"] > 2 * wide["duration_s"]
    # A tiny KV pool forces preemptions: the real scheduler's preemption path runs in the simulation.
    small = SimulatedExecutor(COST, EngineConfig(), num_blocks=24)
    rep = Replica(EngineCore(small), small.clock)
    run_workload(reqs, [rep])
    assert rep.core.stats().num_preemptions > 0


def test_every_token_is_accounted_and_the_clock_is_the_sum_of_step_costs():
    reqs = generate(_spec(n=50, rate=math.inf))
    ex = SimulatedExecutor(COST, EngineConfig(), num_blocks=4096)
    rep = Replica(EngineCore(ex), ex.clock)
    res = run_workload(reqs, [rep])
    assert all(r.num_tokens == r.output_len for r in res.records)
    assert ex.clock.now() == pytest.approx(ex.busy_s)  # all arrive at 0: no idle time
    # Alone, a request costs one prefill step then one decode step per further token.
    one = generate(TrafficSpec(num_requests=1, prompt_len=100, output_len=5))
    s = _sim(one).summary()
    want_ttft = 5e-3 + 100 * 2e-5
    assert s["p50_ttft_s"] == pytest.approx(want_ttft)
    ctx = [101 + i for i in range(4)]
    assert s["p50_e2el_s"] == pytest.approx(want_ttft + sum(5e-3 + 1e-4 + 1e-7 * c for c in ctx))


def test_thousand_requests_simulate_fast():
    reqs = generate(TrafficSpec(num_requests=1000, rate=50, prompt_len="uniform:32:256",
                                output_len="uniform:16:128", seed=1))
    t = time.perf_counter()
    res = _sim(reqs)
    assert time.perf_counter() - t < 5.0
    assert res.summary()["completed"] == 1000


def test_max_concurrency_gates_sends():
    reqs = generate(TrafficSpec(num_requests=8, prompt_len=10, output_len=4))
    ex = SimulatedExecutor(COST, EngineConfig(), num_blocks=256)
    res = run_workload(reqs, [Replica(EngineCore(ex), ex.clock)], max_concurrency=1)
    recs = sorted(res.records, key=lambda r: r.send_s)
    for a, b in itertools.pairwise(recs):
        assert b.send_s == pytest.approx(a.finish_s)  # closed loop: the next one is sent when one finishes


def test_fit_recovers_known_coefficients():
    rng = random.Random(0)
    true = CostModel(c0=3e-3, coef={"seqs": 2e-5, "prefill_tokens": 4e-5, "decode_tokens": 1e-4,
                                    "decode_ctx": 3e-8, "prefill_attn": 5e-6})
    rows = []
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.outputs import ScheduledRequest, SchedulerOutput

    p = SamplingParams()
    for _ in range(300):
        sched = SchedulerOutput()
        for _ in range(rng.randint(0, 16)):
            ctx = rng.randint(1, 2000)
            sched.scheduled.append(ScheduledRequest("d", [1], ctx, [], [], True, p))
        for _ in range(rng.randint(0, 2)):
            start, n = rng.randint(0, 500), rng.randint(2, 300)
            sched.scheduled.append(ScheduledRequest("p", [1] * n, start, [], [], True, p))
        if not sched.scheduled:
            continue
        f = step_features(sched)
        rows.append((f, true.predict(f) * (1 + rng.gauss(0, 0.01))))
    got, err = fit(rows)
    assert err < 0.02
    for name in ("prefill_tokens", "decode_tokens", "decode_ctx"):
        assert got.coef[name] == pytest.approx(true.coef[name], rel=0.15), name
    assert got.c0 == pytest.approx(true.c0, rel=0.15)
    assert CostModel.from_dict(got.as_dict()).as_dict() == got.as_dict()


def test_tp_and_kv_dtype_scaling():
    link = LinkModel(latency_s=10e-6, bandwidth_Bps=100e9)
    tp = COST.with_tp(4, link, hidden_size=4096, num_layers=32, efficiency=1.0)
    assert tp.c0 == pytest.approx(5e-3 / 4 + 2 * 32 * 2 * 3 * 10e-6)
    assert tp.coef["decode_tokens"] > 1e-4 / 4
    assert COST.with_kv_bytes(0.5).coef["decode_ctx"] == pytest.approx(0.5e-7)
    assert set(COST.coef) == set(FEATURES)


def test_traffic_distributions_and_errors():
    ts = arrival_times(4000, rate=100.0, burstiness=1.0, seed=0)
    assert (len(ts) - 1) / ts[-1] == pytest.approx(100.0, rel=0.1)
    bursty = arrival_times(64, rate=10.0, seed=0, burst_size=8)
    assert bursty[:8] == [0.0] * 8 and bursty[8] > 0
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    rng = random.Random(0)
    assert all(64 <= LengthDist.parse("uniform:64:256").sample(rng) <= 256 for _ in range(100))
    m = sum(LengthDist.parse("lognormal:128:0.5").sample(rng) for _ in range(4000)) / 4000
    assert m == pytest.approx(128, rel=0.1)
    with pytest.raises(ConfigError, match="length distribution"):
        LengthDist.parse("zipf:3")
    with pytest.raises(ConfigError, match="rate"):
        arrival_times(3, 0.0)
    shared = generate(TrafficSpec(num_requests=10, prefix_groups=2, prefix_len=32, prompt_len=8))
    by = {}
    for r in shared:
        by.setdefault(r.prefix_group, set()).add(tuple(r.prompt_token_ids[:32]))
    assert all(len(v) == 1 for v in by.values())


def test_bench_serve_client_uses_the_simulators_arrivals(monkeypatch):
    import asyncio

    from torchinferno.bench import serve_client

    slept = []

    async def fake_sleep(s):
        slept.append(s)

    monkeypatch.setattr(serve_client.asyncio, "sleep", fake_sleep)

    async def collect():
        return [i async for i in serve_client._arrivals(20, 5.0, 0.5, random.Random(11))]

    assert asyncio.run(collect()) == list(range(20))
    ts = arrival_times(20, 5.0, 0.5, seed=11)
    assert slept == pytest.approx([b - a for a, b in itertools.pairwise(ts)])


def test_fit_drops_interference_outliers_and_cpu_clock_jumps():
    from torchinferno.sim.executor import CpuClock, make_clock

    rng = random.Random(3)
    true = CostModel(c0=1e-3, coef={"prefill_tokens": 1e-5, "decode_tokens": 5e-5})
    rows = []
    for i in range(200):
        f = (0.0, float(rng.randint(0, 400)), float(rng.randint(1, 32)), 0.0, 0.0, 0.0)
        slow = 3.0 if i % 10 == 0 else 1.0  # every tenth step descheduled by another job
        rows.append((f, true.predict(f) * slow))
    got, err = fit(rows)
    assert got.coef["prefill_tokens"] == pytest.approx(1e-5, rel=0.05)
    assert got.c0 == pytest.approx(1e-3, rel=0.05) and err < 0.01
    c = CpuClock()
    c.advance_to(c.now() + 5.0)
    assert c.now() >= 5.0
    with pytest.raises(ConfigError, match="clock"):
        make_clock("gpu")


def test_async_scheduling_runs_the_real_async_path_on_the_virtual_clock():
    def run(reqs, async_sched):
        ex = SimulatedExecutor(COST, EngineConfig(async_scheduling=async_sched), num_blocks=4096, device="cuda")
        assert ex.config.async_scheduling is async_sched
        res = run_workload(reqs, [Replica(EngineCore(ex), ex.clock)])
        return res, ex

    one = generate(TrafficSpec(num_requests=1, prompt_len=100, output_len=5))
    a, ex_a = run(one, True)
    s, _ = run(one, False)
    # Alone, a request sees the same times: step k's cost lands when the core waits for its result.
    assert a.summary()["p50_e2el_s"] == pytest.approx(s.summary()["p50_e2el_s"])
    many = generate(_spec(n=60, rate=math.inf))
    a, ex_a = run(many, True)
    assert all(r.num_tokens == r.output_len for r in a.records)
    assert ex_a.clock.now() == pytest.approx(ex_a.busy_s)
    # The CUDA default is async, as in the real engine.
    assert SimulatedExecutor(COST, EngineConfig(), device="cuda").config.async_scheduling is True


def test_a_bench_result_replays_with_its_own_seed(tmp_path):
    """A bench-serve result records the seed of its arrival gaps; the trace replays that seed's gaps (a result
    without one: the caller's seed, as before session 29)."""
    import json

    from torchinferno.sim.traffic import load_trace

    doc = {"input_lens": [16] * 20, "output_lens": [4] * 20, "request_rate": 10.0, "burstiness": 1.0}
    plain, seeded = tmp_path / "plain.json", tmp_path / "seeded.json"
    plain.write_text(json.dumps(doc))
    seeded.write_text(json.dumps({**doc, "seed": 1001}))
    assert [r.arrival_s for r in load_trace(plain)] == pytest.approx(arrival_times(20, 10.0, 1.0, 0))
    got = [r.arrival_s for r in load_trace(seeded)]
    assert got == pytest.approx(arrival_times(20, 10.0, 1.0, 1001))
    assert got != pytest.approx(arrival_times(20, 10.0, 1.0, 0))
