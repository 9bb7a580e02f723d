"""``DisaggLLM`` (two spawned engine-core processes, gloo KV transport) on tiny DeepSeek-V4 (per-token rows plus
window entries, compressor and indexer state in its KV): the same tokens as one colocated engine (greedy, seeded,
prefix hits), and aborts at every phase leave no block held on either side."""

import asyncio
import dataclasses
import socket
import time

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.disagg.client import DisaggConfig, DisaggLLM
from torchinferno.engine.assembly import ModelSpec, build_model
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno import ports as ports_mod
from torchinferno.testing import wide_byte_tokenizer

SPEC = ModelSpec(model_kind="deepseek-v4", dtype="float32")
CFG = EngineConfig(block_size=4, kv_cache_memory="4MiB", max_model_len=64, max_num_seqs=8)


def prompts():
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 200, (13,), generator=g).tolist()
    return [shared + [1, 2], torch.randint(0, 200, (9,), generator=g).tolist(), shared + [3], shared,
            torch.randint(0, 200, (21,), generator=g).tolist()]


PARAMS = [SamplingParams(max_tokens=7, ignore_eos=True, **({"temperature": 0.0} if i % 2 == 0 else
                                                           {"temperature": 0.9, "top_k": 20, "seed": 7 + i}))
          for i in range(len(prompts()))]


@pytest.fixture(scope="module")
def pair():
    # the first store port is taken before the prefill role binds it (the race of any auto-picked port): the pair
    # starts once more on fresh ports
    model = build_model(SPEC)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = [taken.getsockname()[1]]
    real = ports_mod.free_port
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ports_mod, "free_port", lambda: ports.pop() if ports else real())
        try:
            llm = DisaggLLM(SPEC, dataclasses.replace(CFG), wide_byte_tokenizer(model.config.vocab_size),
                            DisaggConfig(timeout_s=20))
        finally:
            taken.close()
    assert not ports  # the taken port was handed out first
    yield llm
    llm.shutdown()


async def _collect(llm, rid, prompt, params, stop_after=None):
    toks = []
    async for o in llm.generate(rid, prompt, params):
        toks = o.token_ids
        if stop_after is not None and len(toks) >= stop_after:
            break  # the consumer goes away: the request is aborted
    return toks


def test_tokens_equal_colocated(pair):
    colo = LLMEngine(build_model(SPEC), config=dataclasses.replace(CFG))
    for i, p in enumerate(prompts()):
        colo.add_request(f"r{i}", p, PARAMS[i])
    done = colo.run_to_completion()
    want = [done[f"r{i}"].token_ids for i in range(len(prompts()))]

    async def main():
        first = await _collect(pair, "w", prompts()[0], PARAMS[0])  # the decode side caches the shared prefix
        rest = await asyncio.gather(*[_collect(pair, f"r{i}", p, PARAMS[i]) for i, p in enumerate(prompts())])
        return first, rest

    first, got = asyncio.run(main())
    assert first == want[0] and got == want
    assert pair.totals.count == len(prompts()) + 1 and pair.totals.failed == 0
    assert pair.stats().prefix_hits > 0


def test_aborts_free_every_block(pair):
    async def main():
        await asyncio.gather(*[_collect(pair, f"a{i}", p, PARAMS[i], stop_after=k)
                               for i, (p, k) in enumerate(zip(prompts(), [1, 2, 3, 1, 4]))])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # stats arrive with each core's next message
            s = pair.role_stats()
            if all(x.num_free_blocks == x.num_blocks and x.num_running == 0 for x in s.values()):
                return s
            await asyncio.sleep(0.05)
            await pair.call("load")  # nudges the prefill core; the decode core reports after its transfers
        return pair.role_stats()

    stats = asyncio.run(main())
    assert all(s.num_free_blocks == s.num_blocks for s in stats.values()), stats
    assert pair.num_in_flight() == 0 and pair.is_running and pair.decode_alive
