"""Prefill/decode disaggregation with ``--tensor-parallel-size 2`` per role (two engine cores, each with two spawned
gloo TP workers; KV pair i joins prefill rank i and decode rank i): the same tokens as one colocated engine on one
device (greedy and seeded sampling, prefix hits on both sides) for llama (GQA K/V heads sharded: each pair moves its
shard) and deepseek-v3.2 (MLA latent + indexer keys replicated: each crosses once, on its owner rank's pair, and that decode
rank broadcasts it to the others);
the bytes that cross are exactly the live tokens' KV bytes; every block is free afterwards."""

import asyncio
import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.disagg.client import DisaggConfig, DisaggLLM
from torchinferno.disagg.kv_io import payload_bytes
from torchinferno.disagg.sharding import kv_part
from torchinferno.engine.assembly import ModelSpec, build_model
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.models.protocol import KVLayerSpec, KVSpec
from torchinferno.testing import wide_byte_tokenizer

CFG = EngineConfig(block_size=4, kv_cache_memory="4MiB", max_model_len=64, max_num_seqs=8)


def prompts():
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 200, (13,), generator=g).tolist()
    return [shared + [1, 2], torch.randint(0, 200, (9,), generator=g).tolist(), shared + [3],
            torch.randint(0, 200, (6,), generator=g).tolist()]


PARAMS = [SamplingParams(max_tokens=6, ignore_eos=True, **({"temperature": 0.0} if i % 2 == 0 else
                                                           {"temperature": 0.9, "top_k": 20, "seed": 7 + i}))
          for i in range(len(prompts()))]


async def _collect(llm, rid, prompt, params):
    toks = []
    async for o in llm.generate(rid, prompt, params):
        toks = o.token_ids
    return toks


async def _settled(llm, timeout_s: float = 20.0, roles=("prefill", "decode")):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # stats arrive with each core's next message
        s = llm.role_stats()
        if all(s[r].num_free_blocks == s[r].num_blocks and s[r].num_running == 0 for r in roles):
            break
        await asyncio.sleep(0.05)
        await llm.call("load")
    return llm.role_stats()


@pytest.mark.parametrize("kind", ["llama3", "deepseek-v3.2", pytest.param("deepseek-v4", marks=pytest.mark.slow),
                                  pytest.param("dsv4", marks=pytest.mark.slow)])
def test_tp2_per_role_equals_colocated_and_moves_live_bytes_once(kind, tmp_path):
    spec = ModelSpec(model_kind=kind, dtype="float32")
    model = build_model(spec)
    bpt = model.family.kv_spec(model.config).bytes_per_token(torch.float32)  # the whole model's, one copy
    colo = LLMEngine(model, config=dataclasses.replace(CFG))
    for i, p in enumerate(prompts()):
        colo.add_request(f"r{i}", p, PARAMS[i])
    done = colo.run_to_completion()
    want = [done[f"r{i}"].token_ids for i in range(len(prompts()))]

    record = tmp_path / "integrity.jsonl"
    llm = DisaggLLM(spec, dataclasses.replace(CFG, tensor_parallel_size=2),
                    wide_byte_tokenizer(model.config.vocab_size), DisaggConfig(timeout_s=30, record_path=str(record)))
    try:
        assert "tensor-parallel 2 + 2 ranks (2 KV pairs)" in llm.describe()

        async def main():
            first = await _collect(llm, "w", prompts()[0], PARAMS[0])  # the decode side caches the shared prefix
            rest = await asyncio.gather(*[_collect(llm, f"r{i}", p, PARAMS[i]) for i, p in enumerate(prompts())])
            return first, rest, await _settled(llm)

        first, got, stats = asyncio.run(main())
        totals = llm.totals
    finally:
        llm.shutdown()
    assert first == want[0] and got == want
    assert totals.count == len(prompts()) + 1 and totals.failed == 0
    assert all(s.num_free_blocks == s.num_blocks for s in stats.values()), stats
    assert stats["prefill"].prefix_hits > 0 and stats["decode"].prefix_hits > 0

    recs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(recs) == len(prompts()) + 1
    tokens = [r["kv_transfer"]["tokens_group"] for r in recs]
    full = model.family.kv_spec(model.config)
    if full.is_hybrid:  # V4: the sliding group's rows only from the window on, entries one row per window (kv_io)
        kv = SimpleNamespace(spec=full, block_size=CFG.block_size,
                             tensors=full.allocate(1, CFG.block_size, torch.float32, "cpu"))
        want_bytes = [payload_bytes(kv, r["kv_transfer"]["prompt_tokens"] - t, r["kv_transfer"]["prompt_tokens"])
                      for r, t in zip(recs, tokens)]
    else:
        want_bytes = [t * bpt for t in tokens]
    assert [r["kv_transfer"]["bytes_group"] for r in recs] == want_bytes
    assert totals.nbytes == sum(want_bytes)  # every live row once: shards summed, replicated tensors not doubled
    assert any(t < r["kv_transfer"]["prompt_tokens"] for r, t in zip(recs, tokens))  # a prefix hit on decode
    topo = recs[-1]["topology"]
    assert topo["tensor_parallel_size"] == 2 and topo["decode"]["devices"] == ["cpu", "cpu"]
    assert [(p["prefill_rank"], p["decode_rank"], p["backend"]) for p in topo["kv_pairs"]] == [(0, 0, "gloo"),
                                                                                               (1, 1, "gloo")]


def _fake(local_shapes, full_shapes):
    """A model/cache pair with per-layer per-token shapes (fp32), enough for ``kv_part``."""
    def spec(shapes):
        return KVSpec(tuple(KVLayerSpec("x", tuple((f"t{i}", s) for i, s in enumerate(layer))) for layer in shapes))

    local, full = spec(local_shapes), spec(full_shapes)
    kv = SimpleNamespace(spec=local, tensors=local.allocate(1, 1, torch.float32, "cpu"))
    model = SimpleNamespace(family=SimpleNamespace(kv_spec=lambda cfg: full if cfg == "full" else local),
                            config="local", full_config="full")
    return model, kv


def test_kv_part_sharded_replicated_and_partly_replicated():
    model, kv = _fake([[(1, 8), (1, 8)], [(24,)]], [[(2, 8), (2, 8)], [(24,)]])  # GQA heads split; a latent
    assert kv_part(model, kv, 0, 2) == (((0, 0), (0, 1), (1, 0)), (((1, 0),), ()), 0)
    assert kv_part(model, kv, 1, 2) == (((0, 0), (0, 1)), (((1, 0),), ()), 0)
    model, kv = _fake([[(24,), (8,)], [(24,), (8,)]], [[(24,), (8,)], [(24,), (8,)]])  # MLA: all replicated
    owners = (((0, 0), (1, 1)), ((0, 1), (1, 0)))  # greedy by bytes: 24+8 and 8+24 per token
    assert kv_part(model, kv, 0, 2) == (owners[0], owners, 0) and kv_part(model, kv, 1, 2) == (owners[1], owners, 0)
    model, kv = _fake([[(1, 8)]], [[(2, 8)]])  # 2 KV heads over 4 ranks: each head on two ranks
    moved, fanned, dup = kv_part(model, kv, 3, 4)
    assert moved == ((0, 0),) and fanned == () and dup * 4 == (4 * 8 - 16) * 4  # 16 duplicate values/token in all
    model, kv = _fake([[(2, 8)]], [[(2, 8)]])
    assert kv_part(model, kv, 0, 1) == (((0, 0),), (), 0)  # one rank: nothing is "replicated"


@pytest.mark.slow
def test_serve_tp2_per_role_answers_like_colocated(tmp_path):
    """``serve --disaggregation-mode prefill-decode --tensor-parallel-size 2`` over HTTP: the completions of a
    colocated one-device server; the integrity record names the per-role TP size and the KV pairs."""
    import httpx

    from torchinferno.server.live import LiveServer

    common = ["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "48", "--block-size", "4",
              "--kv-cache-memory", "2MiB", "--served-model-name", "tiny"]
    record = tmp_path / "integrity.jsonl"
    bodies = [{"model": "tiny", "prompt": p[:12], "max_tokens": 5, "ignore_eos": True, "temperature": 0.0 if i % 2 == 0
               else 0.8, "seed": 30 + i} for i, p in enumerate(prompts())]

    def answers(base):
        return [httpx.post(f"{base}/v1/completions", json=b, timeout=60).json()["choices"][0]["text"] for b in bodies]

    colo = LiveServer(common)
    try:
        want = answers(colo.base)
    finally:
        colo.stop()
    dis = LiveServer([*common, "--disaggregation-mode", "prefill-decode", "--tensor-parallel-size", "2",
                      "--disaggregation-record", str(record), "--disaggregation-timeout", "30"])
    try:
        got = answers(dis.base)
    finally:
        dis.stop()
    assert got == want
    topo = json.loads(record.read_text().splitlines()[-1])["topology"]
    assert topo["prefill"]["tensor_parallel_size"] == topo["decode"]["tensor_parallel_size"] == 2
    assert len(topo["kv_pairs"]) == 2


def test_role_devices_one_per_rank():
    from torchinferno.disagg.topology import distinct_ports, role_devices
    from torchinferno.errors import ConfigError

    assert role_devices("cpu", 3, "--decode-devices") == ["cpu"] * 3
    assert role_devices("cuda:4, cuda:5", 2, "--decode-devices") == ["cuda:4", "cuda:5"]
    assert role_devices("cuda", 1, "--decode-devices") == ["cuda"]
    for bad in ("cuda:0", "cuda:0,cuda:0", "cuda:0,cpu", "cuda:0,cuda:1,cuda:2"):
        with pytest.raises(ConfigError, match="comma list of 2 distinct CUDA devices"):
            role_devices(bad, 2, "--prefill-devices")
    assert distinct_ports(3, 9000) == [9000, 9001, 9002] and len(set(distinct_ports(5, 0))) == 5


def test_rank_device_takes_its_entry_of_a_device_list():
    from torchinferno.errors import ConfigError
    from torchinferno.parallel.load import _rank_device

    assert _rank_device("cpu", SimpleNamespace(rank=1, world_size=2)) == "cpu"
    with pytest.raises(ConfigError, match="has 2 entries for 3 ranks"):
        _rank_device("cuda:4,cuda:5", SimpleNamespace(rank=0, world_size=3))


@pytest.mark.slow
def test_tp2_decode_role_killed_mid_stream_then_colocated():
    """The decode core (and with it its TP workers) dies mid-stream: that request fails with a clear error, the
    prefill role frees its blocks, later requests are served colocated on the prefill role (same tokens)."""
    import os
    import signal

    from torchinferno.errors import EngineDeadError

    spec = ModelSpec(model_kind="llama3", dtype="float32")
    model = build_model(spec)
    colo = LLMEngine(model, config=dataclasses.replace(CFG))
    colo.add_request("c", prompts()[1], PARAMS[1])
    want = colo.run_to_completion()["c"].token_ids
    llm = DisaggLLM(spec, dataclasses.replace(CFG, tensor_parallel_size=2),
                    wide_byte_tokenizer(model.config.vocab_size), DisaggConfig(timeout_s=30))
    try:
        async def main():
            toks, err, killed = [], None, False
            try:
                async for o in llm.generate("k", prompts()[0], SamplingParams(max_tokens=40, ignore_eos=True)):
                    toks = o.token_ids
                    if len(toks) >= 3 and not killed:  # >=: a busy host can deliver several tokens in one output
                        os.kill(llm.decode.pid, signal.SIGKILL)
                        killed = True
            except EngineDeadError as e:
                err = str(e)
            stats = await _settled(llm, roles=("prefill",))
            return err, stats, await _collect(llm, "after", prompts()[1], PARAMS[1])

        err, stats, after = asyncio.run(main())
    finally:
        llm.shutdown()
    assert err is not None and "decode engine core" in err
    assert stats["prefill"].num_free_blocks == stats["prefill"].num_blocks and not llm.decode_alive
    assert after == want
