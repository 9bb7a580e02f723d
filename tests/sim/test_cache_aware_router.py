"""The serving router's cache-aware policy in the cluster simulator (``sim-plan --router cache_aware``): on
shared-prefix traffic it keeps prefix groups together like the oracle ``prefix_aware`` router, and beats round-robin's
prefix hit rate; the chat trace is deterministic for a seed."""

from torchinferno.sim.calibration import Calibration
from torchinferno.sim.chat_trace import ChatTraceSpec, shared_system_prompt
from torchinferno.sim.cluster import ClusterSpec, simulate_cluster
from torchinferno.sim.cost_model import CostModel
from torchinferno.sim.traffic import TrafficSpec, generate

CAL = Calibration(cost=CostModel(c0=2e-3, coef={"prefill_tokens": 5e-6, "decode_tokens": 2e-5}))


def test_cache_aware_keeps_prefix_groups_together():
    reqs = generate(TrafficSpec(num_requests=64, rate=50.0, prompt_len=16, output_len=8, prefix_groups=4,
                                prefix_len=128, seed=2))
    _, ca = simulate_cluster(ClusterSpec(replicas=4, router="cache_aware"), CAL, reqs)
    _, pa = simulate_cluster(ClusterSpec(replicas=4, router="prefix_aware"), CAL, reqs)
    _, rr = simulate_cluster(ClusterSpec(replicas=4, router="round_robin"), CAL, reqs)
    assert ca["prefix_hit_rate"] > rr["prefix_hit_rate"]
    assert ca["prefix_hit_rate"] >= 0.9 * pa["prefix_hit_rate"]


def test_chat_trace_shape_and_determinism():
    spec = ChatTraceSpec(system_prompts=3, users=2, turns=3, system_len=32, rate=4.0, think_s=0.5, vocab_size=100)
    a, b = shared_system_prompt(spec), shared_system_prompt(spec)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b] and len(a) == 18
    by_id = {r.request_id: r for r in a}
    for c in range(6):
        t0, t1, t2 = (by_id[f"c{c}-t{k}"] for k in range(3))
        assert t0.arrival_s <= t1.arrival_s <= t2.arrival_s
        # each turn extends the previous one's prompt (plus the trace's reply and a new user message)
        assert t1.prompt_token_ids[:t0.prompt_len] == t0.prompt_token_ids
        assert t2.prompt_token_ids[:t1.prompt_len] == t1.prompt_token_ids
        assert t1.prompt_len >= t0.prompt_len + t0.output_len + 16
    groups = {r.prefix_group for r in a}
    assert groups == {0, 1, 2}
    assert all(r.prompt_token_ids[:32] == next(x for x in a if x.prefix_group == r.prefix_group).prompt_token_ids[:32]
               for r in a)
