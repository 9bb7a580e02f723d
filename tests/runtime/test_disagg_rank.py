"""runtime.disagg in one process: a prefill rank and a decode rank of every family, their KV handed over through the
real wire format (and, for the smoke command, real HTTP servers on threads), checked against a colocated
generation of the same seeded model (fp32, greedy and seeded sampling). Refusals change nothing."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import generate
from torchinferno.errors import TorchInfernoError
from torchinferno.runtime.disagg import (
    DisaggRank,
    RankConfig,
    RpcError,
    decode_message,
    encode_message,
    make_server,
)
from torchinferno.testing import tiny_model

FAMILIES = ["llama3", "deepseek", "dsv4", "deepseek_v4"]  # GQA, MLA + DSA indexer, MLA, V4 (CSA/HCA/sliding)
pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [(7 * i + 3) % 250 + 1 for i in range(21)]  # spans several blocks and V4's compression windows


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture(scope="module", params=FAMILIES)
def ranks(request):
    """(prefill rank, decode rank, colocated reference model): different block sizes on the two sides."""
    fam = request.param
    clock = Clock()
    p = DisaggRank(RankConfig("prefill", 0, 1, model_kind=fam, block_size=4, num_blocks=24, kv_ttl_s=10.0), clock=clock)
    d = DisaggRank(RankConfig("decode", 1, 2, model_kind=fam, block_size=8, num_blocks=8))
    return p, d, tiny_model(fam), clock


def handoff(p, d, prompt, sampling, rid="r1", release=True):
    c, tensors = p.prefill({"request_id": rid, "prompt_token_ids": prompt, "sampling": sampling})
    c, tensors = decode_message(encode_message(c, tensors))  # the bytes the HTTP layer moves
    out = d.decode({"request_id": rid, "prompt_token_ids": prompt, "first_token": c["first_token"],
                    "sampling": sampling}, tensors)
    if release:
        p.release({"request_id": rid})
    return c, tensors, out


@pytest.mark.parametrize("sampling", [{"max_tokens": 5, "temperature": 0.0},
                                      {"max_tokens": 5, "temperature": 0.9, "top_k": 50, "seed": 11}],
                         ids=["greedy", "seeded"])
def test_tokens_equal_colocated_and_bytes_are_the_live_kv(ranks, sampling):
    p, d, ref, _ = ranks
    free_p, free_d = p.pool.num_free, d.pool.num_free
    c, tensors, out = handoff(p, d, PROMPT, sampling)
    sp = SamplingParams(**sampling)
    assert out["token_ids"] == generate(ref, [PROMPT], sp)[0].token_ids
    assert c["kv_bytes"] == out["kv_bytes_received"] == len(PROMPT) * p.kv_spec.bytes_per_token(torch.float32)
    names = {f"layer.{i}.{n}" for i, layer in enumerate(p.kv_spec.layers) for n, _ in layer.tensors}
    assert {k for k in tensors if k.startswith("layer.")} == names  # every layer, every KV kind
    assert (p.pool.num_free, d.pool.num_free) == (free_p, free_d)


def test_prefix_hit_on_the_prefill_rank_computes_only_the_rest(ranks):
    """A prompt sharing 4 full blocks with an earlier one reuses them (cached_tokens) and still equals colocated."""
    p, d, ref, _ = ranks
    sampling = {"max_tokens": 4, "temperature": 0.0}
    handoff(p, d, PROMPT, sampling, rid="first")
    other = PROMPT[:16] + [251, 252, 253]
    c, _, out = handoff(p, d, other, sampling, rid="second")
    assert c["cached_tokens"] == 16 and c["kv_bytes"] == len(other) * p.kv_spec.bytes_per_token(torch.float32)
    assert out["token_ids"] == generate(ref, [other], SamplingParams(**sampling))[0].token_ids
    assert p.health()["prefix_cache"]["hit_rate"] > 0


@pytest.mark.parametrize("fam", ["llama3", "deepseek_v4"])
def test_fp8_kv_moves_as_stored(fam):
    """An FP8 cache hands over its stored bytes (1 byte per value) and decodes like a colocated FP8-cache run."""
    from torchinferno.engine.generate import StaticGenerator

    fp8 = torch.float8_e4m3fn
    p = DisaggRank(RankConfig("prefill", 0, 1, model_kind=fam, block_size=4, num_blocks=8, kv_cache_dtype="fp8"))
    d = DisaggRank(RankConfig("decode", 1, 2, model_kind=fam, block_size=8, num_blocks=8, kv_cache_dtype="fp8"))
    sampling = {"max_tokens": 4, "temperature": 0.0}
    c, tensors, out = handoff(p, d, PROMPT, sampling)
    assert {t.dtype for t in tensors.values()} == {fp8}
    assert c["kv_bytes"] == len(PROMPT) * p.kv_spec.bytes_per_token(fp8) == len(PROMPT) * p.kv_spec.values_per_token()
    ref = StaticGenerator(tiny_model(fam), 1, 32, cache_dtype=fp8).generate([PROMPT], SamplingParams(**sampling))
    assert out["token_ids"] == ref[0].token_ids


def test_the_decode_rank_reads_the_handed_over_kv(ranks):
    """Zeroed KV rows change the continuation: the decode rank does not recompute the prompt itself."""
    p, d, _, _ = ranks
    sampling = {"max_tokens": 5, "temperature": 0.0}
    c, tensors, out = handoff(p, d, PROMPT, sampling)
    zeroed = {k: torch.zeros_like(v) for k, v in tensors.items()}
    bad = d.decode({"request_id": "z", "prompt_token_ids": PROMPT, "first_token": c["first_token"],
                    "sampling": sampling}, zeroed)
    assert bad["token_ids"] != out["token_ids"]


def test_malformed_payloads_are_refused_and_change_nothing(ranks):
    p, d, _, _ = ranks
    sampling = {"max_tokens": 4, "temperature": 0.0}
    c, tensors = p.prefill({"request_id": "m", "prompt_token_ids": PROMPT, "sampling": sampling})
    ctl = {"request_id": "m", "prompt_token_ids": PROMPT, "first_token": c["first_token"], "sampling": sampling}
    name = next(k for k in tensors if k.startswith("layer."))
    cases = {
        "dtype": {**tensors, name: tensors[name].to(torch.float16)},
        "shape": {**tensors, name: tensors[name][:-1]},
        "missing": {k: v for k, v in tensors.items() if k != name},
        "unknown": {**tensors, "layer.99.k": tensors[name]},
        "nan": {**tensors, name: torch.full_like(tensors[name], float("nan"))},
    }
    before = (p.pool.num_free, sorted(p.held), d.pool.num_free)
    for why, bad in cases.items():
        with pytest.raises(RpcError) as e:
            d.decode(ctl, bad)
        assert e.value.status == 400 and "\n" not in str(e.value) and (name in str(e.value) or why == "unknown"), why
    body = encode_message(ctl, tensors)
    for why, raw in {"truncated": body[:-7], "header": body[:5], "magic": b"XXXX" + body[4:],
                     "json": body[:8] + b"{" * (len(body) - 8)}.items():
        with pytest.raises(RpcError) as e:
            decode_message(raw)
        assert e.value.status == 400, why
    for bad_ctl in ({**ctl, "first_token": -1}, {**ctl, "model_id": "some-other-model"},
                    {**ctl, "sampling": {"max_tokens": 4, "stop_token_ids": 5}}, {**ctl, "prompt_token_ids": [10**9]}, {**ctl, "request_id": ""},
                    {**ctl, "sampling": {"max_tokens": 4, "bogus": 1}}, {**ctl, "sampling": {"max_tokens": 0}}):
        with pytest.raises(TorchInfernoError) as e:  # RpcError, or SamplingError (a 400 in the HTTP layer)
            d.decode(bad_ctl, tensors)
        assert getattr(e.value, "status", 400) == 400 and "\n" not in str(e.value)
    assert (p.pool.num_free, sorted(p.held), d.pool.num_free) == before
    out = d.decode(ctl, tensors)  # a good request still works
    assert out["token_ids"][0] == c["first_token"]
    p.release({"request_id": "m"})


def test_unknown_duplicate_full_and_expired_requests(ranks):
    p, d, _, clock = ranks
    sampling = {"max_tokens": 3, "temperature": 0.0}
    with pytest.raises(RpcError) as e:
        p.release({"request_id": "never"})
    assert e.value.status == 404 and "never" in str(e.value)
    free = p.pool.num_free
    p.prefill({"request_id": "a", "prompt_token_ids": PROMPT, "sampling": sampling})
    with pytest.raises(RpcError) as e:
        p.prefill({"request_id": "a", "prompt_token_ids": PROMPT, "sampling": sampling})
    assert e.value.status == 409
    # back-pressure: the decode rank has 8 blocks of 8 tokens; a request needing more is refused (503), not dropped
    c, tensors = p.kv({"request_id": "a"})
    long = {"max_tokens": 50, "temperature": 0.0, "ignore_eos": True}
    with pytest.raises(RpcError) as e:
        d.decode({"request_id": "a", "prompt_token_ids": PROMPT, "first_token": c["first_token"], "sampling": long},
                 tensors)
    assert e.value.status == 503 and d.pool.num_free == d.pool.num_blocks
    # TTL: a held request nobody releases is freed once kv_ttl_s passes
    assert p.pool.num_free < free and p.health()["held_requests"] == ["a"]
    clock.t += 11.0
    assert p.health()["held_requests"] == [] and p.pool.num_free == free
    with pytest.raises(RpcError):
        p.kv({"request_id": "a"})


def test_smoke_command_over_http_checks_against_colocated(ranks, capsys):
    """disagg-smoke --check --json against real HTTP servers (threads) for every family."""
    from torchinferno.cli.main import main

    p, d, _, _ = ranks
    servers = [make_server(r, "127.0.0.1", 0) for r in (p, d)]
    for s in servers:
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
        rc = main(["disagg-smoke", "--prefill-url", urls[0], "--decode-url", urls[1], "--prompt", *map(str, PROMPT),
                   "--new-tokens", "4", "--check", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["token_ids"] == out["colocated_token_ids"] and len(out["token_ids"]) == 4
        assert out["kv_bytes"] == out["kv_bytes_expected"] == len(PROMPT) * p.kv_spec.bytes_per_token(torch.float32)
        assert p.health()["held_requests"] == []
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_any_corrupted_frame_is_a_400_never_a_crash():
    """Random byte flips and truncations of a valid frame: decode_message raises RpcError(400) or parses."""
    import random

    from torchinferno.runtime.disagg_wire import decode_json

    body = encode_message({"request_id": "f", "n": [1, 2]}, {"layer.0.k": torch.randn(3, 4),
                                                             "sampler.rng_state": torch.zeros(5, dtype=torch.uint8)})
    rnd = random.Random(0)
    for _ in range(400):
        b = bytearray(body)
        for _ in range(rnd.randint(1, 6)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        if rnd.random() < 0.3:
            b = b[: rnd.randrange(len(b))]
        try:
            decode_message(bytes(b))
        except RpcError as e:
            assert e.status == 400 and "\n" not in str(e)
    with pytest.raises(RpcError):
        decode_json(b"[" * 100000)  # too deep: a 400, not a RecursionError


def test_ttl_sweeper_frees_unreleased_kv_without_any_rpc():
    import time

    from torchinferno.runtime.disagg_http import start_ttl_sweeper

    p = DisaggRank(RankConfig("prefill", 0, 1, model_kind="llama3", block_size=4, num_blocks=8, kv_ttl_s=0.4))
    stop = start_ttl_sweeper(p)
    try:
        p.prefill({"request_id": "lost", "prompt_token_ids": PROMPT[:6], "sampling": {"max_tokens": 3}})
        assert "lost" in p.held and p.pool.num_free == 6
        deadline = time.monotonic() + 20
        while "lost" in p.held:  # read the state directly: health() would expire it itself
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert p.pool.num_free == 8 and p.stats.expired == 1
    finally:
        stop.set()
