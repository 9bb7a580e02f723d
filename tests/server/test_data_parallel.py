"""``serve --data-parallel-size 2``: two engine-core processes behind one API server give the same greedy tokens as
one engine (official openai client), spread requests by the router, abort on the core that holds the request, and
show per-replica series and the router's hit rate in /metrics."""

import time

import httpx
import pytest

openai = pytest.importorskip("openai")

FLAGS = ["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "128", "--served-model-name", "tiny",
         "--max-num-seqs", "8"]


@pytest.fixture(scope="module")
def dp_server():
    from torchinferno.server.live import LiveServer

    s = LiveServer([*FLAGS, "--data-parallel-size", "2", "--router-policy", "round-robin"], start_timeout=120)
    yield s
    s.stop()


def _reference(tok, prompt: str, max_tokens: int) -> str:
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.engine.generate import generate

    model = build_model(ModelSpec(model_kind="llama3", dtype="float32"))  # the servers' model (seeded)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return generate(model, [tok.encode(prompt)], params, tokenizer=tok)[0].text


def test_two_replicas_give_the_greedy_tokens_of_one_engine(dp_server):
    client = openai.OpenAI(base_url=dp_server.base + "/v1", api_key="unused", max_retries=0)
    prompts = ["hello world", "the quick brown fox", "data parallel", "abc"]
    kw = {"model": "tiny", "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}
    texts = [client.completions.create(prompt=p, **kw).choices[0].text for p in prompts]
    streamed = "".join(c.choices[0].text for c in client.completions.create(prompt=prompts[0], stream=True, **kw)
                       if c.choices)
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw)
    assert chat.usage.completion_tokens == 10
    tok = dp_server.engine.tokenizer
    assert texts == [_reference(tok, p, 10) for p in prompts]
    assert streamed == texts[0]
    routed = dp_server.engine.policy.stats.per_replica
    assert routed[0] >= 2 and routed[1] >= 2  # round-robin used both cores
    per = dp_server.engine.replica_stats()
    assert all(s.num_finished >= 2 for s in per)
    body = httpx.get(dp_server.base + "/metrics").text
    assert 'torchinferno_replica_requests_routed{model_name="tiny",replica="1"}' in body
    assert 'torchinferno_router_prefix_hit_rate{model_name="tiny",policy="round-robin"}' in body
    assert "torchinferno_replica_kv_cache_usage_perc" in body


def test_abort_reaches_the_core_that_holds_the_request(dp_server):
    eng = dp_server.engine
    before = [s.num_aborted for s in eng.replica_stats()]
    routed = list(eng.policy.stats.per_replica)
    body = {"model": "tiny", "prompt": "a long one", "max_tokens": 100, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", dp_server.base + "/v1/completions", json=body, timeout=30) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 3:
                break  # the client goes away mid-stream: the server aborts the request
    owner = next(i for i in range(2) if eng.policy.stats.per_replica[i] != routed[i])
    deadline = time.time() + 20
    while eng.replicas[owner].stats().num_aborted == before[owner] and time.time() < deadline:
        time.sleep(0.05)
    after = [s.num_aborted for s in eng.replica_stats()]
    assert after[owner] == before[owner] + 1 and after[1 - owner] == before[1 - owner]
    assert not eng.owner and sum(eng.in_flight) == 0


def test_data_parallel_with_in_process_engine_is_refused():
    import argparse

    from torchinferno.errors import ConfigError
    from torchinferno.server.launch import add_server_args, build

    p = argparse.ArgumentParser()
    add_server_args(p)
    with pytest.raises(ConfigError, match="--data-parallel-size"):
        build(p.parse_args([*FLAGS, "--data-parallel-size", "2", "--engine-in-process"]))
    with pytest.raises(ConfigError, match="--data-parallel-size must be >= 1"):
        build(p.parse_args([*FLAGS, "--data-parallel-size", "0"]))


def test_replica_devices():
    from torchinferno.engine.assembly import ModelSpec
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.dp_llm import replica_specs

    cpu = ModelSpec(model_kind="llama3", device="cpu")
    assert replica_specs(cpu, EngineConfig(), 2) == [cpu, cpu]
    tp = ModelSpec(model_kind="llama3", device="cuda")
    assert replica_specs(tp, EngineConfig(tensor_parallel_size=2), 2) == [tp, tp]  # ranks use cuda:rank


def test_sum_stats_adds_counters_and_weights_usage():
    from torchinferno.engine.core import EngineStats
    from torchinferno.engine.dp_llm import sum_stats

    a = EngineStats(1, 2, 0.5, 100, 16, 50, 3, 10, 4, 0, 5, 5, 3, 30, 40, 20, 2, 0)
    b = EngineStats(2, 0, 0.25, 300, 16, 225, 1, 30, 6, 1, 7, 7, 8, 10, 60, 30, 3, 1)
    s = sum_stats([a, b])
    assert (s.num_running, s.num_waiting, s.num_blocks, s.prefix_queries, s.prefix_hits) == (3, 2, 400, 40, 10)
    assert s.kv_usage == (0.5 * 100 + 0.25 * 300) / 400 and s.block_size == 16
    assert (s.max_batch_seqs, s.max_batch_tokens) == (8, 30) and s.prefix_hit_rate == 0.25


def _prefix_hits(server, policy, system: str) -> tuple[int, list[int]]:
    """Swap the router's policy, send 6 prompts sharing ``system`` one after another; -> (prefix-cache hit tokens
    over both replicas during the run, requests per replica)."""
    from torchinferno.engine.route_policy import make_policy

    eng = server.engine
    eng.policy = make_policy(policy, 2, **({"min_match_tokens": 16} if policy == "cache-aware" else {}))
    before = sum(s.prefix_hits for s in eng.replica_stats())
    for i in range(6):
        r = httpx.post(server.base + "/v1/completions",
                       json={"model": "tiny", "prompt": f"{system} user {i}", "max_tokens": 2})
        assert r.status_code == 200
    return sum(s.prefix_hits for s in eng.replica_stats()) - before, eng.policy.stats.per_replica


def test_cache_aware_keeps_a_shared_prefix_on_one_replica(dp_server):
    eng, saved = dp_server.engine, dp_server.engine.policy
    try:
        rr_hits, rr_routed = _prefix_hits(dp_server, "round-robin", "A" * 64)
        ca_hits, ca_routed = _prefix_hits(dp_server, "cache-aware", "B" * 64)
    finally:
        eng.policy = saved
    assert rr_routed == [3, 3] and sorted(ca_routed) == [0, 6]
    assert ca_hits > rr_hits > 0  # round-robin computes the shared prefix once on each replica


def test_priority_field_and_scheduling_policy_flag(dp_server):
    import argparse

    from torchinferno.server.args import add_server_args, engine_config_from_args

    ok = httpx.post(dp_server.base + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2,
                                                              "priority": -3})
    assert ok.status_code == 200  # accepted (served in arrival order under the default fcfs)
    bad = httpx.post(dp_server.base + "/v1/completions", json={"model": "tiny", "prompt": "x", "priority": "high"})
    assert bad.status_code == 400 and "priority" in bad.json()["error"]["message"]
    p = argparse.ArgumentParser()
    add_server_args(p)
    assert engine_config_from_args(p.parse_args(["--scheduling-policy", "priority"]), 128).scheduling_policy == "priority"
    with pytest.raises(SystemExit):
        p.parse_args(["--scheduling-policy", "lifo"])


def test_a_dead_core_stops_the_whole_server(dp_server):  # last: it kills one of the module's cores
    eng = dp_server.engine
    reasons = []
    eng.on_dead = reasons.append
    eng.replicas[1].core.proc.kill()
    deadline = time.time() + 20
    while not reasons and time.time() < deadline:
        time.sleep(0.05)
    assert reasons and reasons[0].startswith("data-parallel replica 1: the engine core process exited")
    assert not eng.is_running
    r = httpx.post(dp_server.base + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and httpx.get(dp_server.base + "/health").status_code == 503
