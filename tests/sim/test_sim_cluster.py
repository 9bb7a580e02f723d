"""Cluster model: routers, P/D disaggregation with KV transfer, TP costs, planning; 8 replicas stay fast."""

import time

import pytest

from torchinferno.errors import ConfigError
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.cluster import ClusterSpec, simulate_cluster
from torchinferno.sim.cost_model import CostModel, LinkModel
from torchinferno.sim.plan import SLO, candidates, plan
from torchinferno.sim.routing import make_router
from torchinferno.sim.traffic import TrafficSpec, generate

CAL = Calibration(cost=CostModel(c0=2e-3, coef={"prefill_tokens": 5e-6, "decode_tokens": 2e-5, "decode_ctx": 1e-8}),
                  hidden_size=4096, num_layers=32, kv_bytes_per_token=131072)


def _reqs(n=64, **kw):
    return generate(TrafficSpec(num_requests=n, rate=kw.pop("rate", 200.0), prompt_len=kw.pop("prompt_len", "uniform:32:256"),
                                output_len=kw.pop("output_len", "uniform:8:64"), **kw))


def test_round_robin_spreads_evenly_and_least_loaded_balances():
    reqs = _reqs(64)
    _, rr = simulate_cluster(ClusterSpec(replicas=4, router="round_robin"), CAL, reqs)
    assert sorted(rr["per_replica_requests"].values()) == [16, 16, 16, 16]
    _, ll = simulate_cluster(ClusterSpec(replicas=4, router="least_loaded"), CAL, reqs)
    assert all(v > 0 for v in ll["per_replica_requests"].values())
    _, one = simulate_cluster(ClusterSpec(replicas=1), CAL, reqs)
    assert ll["p99_ttft_s"] < one["p99_ttft_s"]  # four replicas queue less than one


def test_prefix_aware_routing_keeps_prefix_groups_together():
    reqs = generate(TrafficSpec(num_requests=64, rate=50.0, prompt_len=16, output_len=8, prefix_groups=4,
                                prefix_len=128, seed=2))
    _, pa = simulate_cluster(ClusterSpec(replicas=4, router="prefix_aware"), CAL, reqs)
    _, rr = simulate_cluster(ClusterSpec(replicas=4, router="round_robin"), CAL, reqs)
    assert pa["prefix_hit_rate"] > rr["prefix_hit_rate"]


def test_disaggregation_moves_kv_and_pays_the_link():
    reqs = _reqs(32)
    spec = ClusterSpec(replicas=1, prefill_replicas=1, pd_link=LinkModel(1e-3, 1e9))
    res, s = simulate_cluster(spec, CAL, reqs)
    assert s["completed"] == 32 and all(r.num_tokens == r.output_len for r in res.records)
    assert all(">d0" in r.replica for r in res.records if r.output_len > 1)
    slow = ClusterSpec(replicas=1, prefill_replicas=1, pd_link=LinkModel(50e-3, 1e9))
    _, s2 = simulate_cluster(slow, CAL, reqs)
    # The first token comes from the prefill replica; the KV hop delays the second, so TPOT/ITL grow.
    assert s2["p50_ttft_s"] == pytest.approx(s["p50_ttft_s"], rel=0.2)
    assert s2["p99_itl_s"] > s["p99_itl_s"] + 0.03
    # Decode replicas never recompute the prompt: a transferred request's prefill row costs nothing.
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.outputs import ScheduledRequest, SchedulerOutput

    sched = SchedulerOutput([ScheduledRequest("x", [1] * 100, 0, [], [], True, SamplingParams())])
    assert CAL.cost.step_cost(sched, {"x"}) == pytest.approx(2e-3)
    assert CAL.cost.step_cost(sched) == pytest.approx(2e-3 + 100 * 5e-6)


def test_tp_needs_model_shape_and_speeds_up_steps():
    reqs = _reqs(32, rate=float("inf"))
    big = Calibration(cost=CostModel(c0=20e-3, coef={"prefill_tokens": 5e-5, "decode_tokens": 2e-4}),
                      hidden_size=4096, num_layers=32)
    _, tp1 = simulate_cluster(ClusterSpec(replicas=1, tp=1), big, reqs)
    _, tp4 = simulate_cluster(ClusterSpec(replicas=1, tp=4), big, reqs)
    assert tp4["duration_s"] < tp1["duration_s"] / 2
    # A slow link makes TP lose: the collectives cost more than the split compute saves.
    _, slow = simulate_cluster(ClusterSpec(replicas=1, tp=4, tp_link=LinkModel(1e-3, 1e9)), big, reqs)
    assert slow["duration_s"] > tp1["duration_s"]
    with pytest.raises(ConfigError, match="hidden_size"):
        simulate_cluster(ClusterSpec(tp=2), Calibration(cost=CAL.cost), reqs)
    with pytest.raises(ConfigError, match="router"):
        make_router("random")


def test_plan_picks_fewest_gpus_meeting_the_slo():
    assert [c.num_gpus for c in candidates(ClusterSpec(), 2, (1, 2))] == [1, 2, 2, 2]
    reqs = _reqs(60, rate=100.0)
    res = plan(ClusterSpec(), CAL, reqs, SLO(p99_ttft_s=0.05, p99_tpot_s=0.01), max_gpus=4, tp_sizes=(1, 2),
               log=lambda *_: None)
    assert res["best"] is not None
    worse = [r for r in res["candidates"] if r["gpus"] < res["best"]["gpus"]]
    assert all(not r["meets_slo"] for r in worse)
    impossible = plan(ClusterSpec(), CAL, reqs, SLO(1e-6, 1e-6), max_gpus=2, tp_sizes=(1,), log=lambda *_: None)
    assert impossible["best"] is None


def test_ten_thousand_requests_on_eight_replicas():
    reqs = generate(TrafficSpec(num_requests=10_000, rate=400.0, prompt_len="uniform:32:256",
                                output_len="uniform:8:64", seed=5))
    t = time.perf_counter()
    _, s = simulate_cluster(ClusterSpec(replicas=8), CAL, reqs)
    assert s["completed"] == 10_000
    assert time.perf_counter() - t < 60


def test_cluster_simulation_is_deterministic():
    reqs = generate(TrafficSpec(num_requests=80, rate=100.0, prompt_len="uniform:8:64", output_len="uniform:4:32",
                                prefix_groups=3, prefix_len=32, seed=9))
    for spec in (ClusterSpec(replicas=3, router="prefix_aware"), ClusterSpec(replicas=2, prefill_replicas=1)):
        a = simulate_cluster(spec, CAL, reqs)[1]
        b = simulate_cluster(spec, CAL, reqs)[1]
        assert a == b
