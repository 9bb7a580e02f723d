"""Prefix-aware router: a shared-prefix request goes to the replica that holds the prefix."""

import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.engine.router import PrefixRouter

SP = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _toks(n, seed):
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_router_prefers_the_replica_holding_the_prefix(tiny_llama):
    replicas = [LLMEngine(tiny_llama, num_gpu_blocks=32, max_model_len=128) for _ in range(3)]
    router = PrefixRouter(replicas)
    system = _toks(40, 1)
    # Warm replica 2 (not the default pick on a load tie, which is replica 0) with the prefix.
    replicas[2].add_request("warm", system + _toks(5, 2), SP)
    replicas[2].run_to_completion()
    assert replicas[2].cached_prefix_tokens(system) == 32 and replicas[0].cached_prefix_tokens(system) == 0

    d = router.add_request("shared", system + _toks(7, 3), SP)
    assert (d.replica, d.matched_tokens, d.reason) == (2, 32, "prefix")
    # A miss goes to the least loaded replica (replica 2 now has one request in flight).
    miss = router.add_request("miss", _toks(20, 4), SP)
    assert miss.reason == "least_loaded" and miss.replica == 0
    while router.has_unfinished():
        router.step()
    assert replicas[2].stats().prefix_hits == 32 and replicas[0].stats().prefix_hits == 0
    assert router.stats.prefix_routed == 1 and router.stats.per_replica == [1, 0, 1]

    # With a load cap, an overloaded prefix holder loses to the least loaded replica.
    capped = PrefixRouter(replicas, max_load_gap=1)
    for i in range(3):
        replicas[2].add_request(f"busy{i}", _toks(3, 10 + i), SP)
    d = capped.route(system + _toks(3, 9))
    assert d.reason == "least_loaded" and d.replica in (0, 1)
    assert router.route(system + _toks(3, 9)).replica == 2  # uncapped: still follows the prefix
