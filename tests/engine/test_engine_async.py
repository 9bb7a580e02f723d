"""AsyncEngine: concurrent consumers are batched together; a consumer that stops iterating
(client disconnect) aborts its request and frees its blocks."""

import asyncio
import time

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.async_engine import AsyncEngine, EngineDeadError
from torchinferno.engine.generate import generate
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError


def _prompts():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 250, (n,), generator=g).tolist() for n in (5, 19, 2, 30)]


async def _wait_for(pred, timeout=10.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def test_concurrent_consumers_get_plain_generation_outputs(tiny_llama):
    sp = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ref = [r.token_ids for r in generate(tiny_llama, _prompts(), sp)]
    engine = AsyncEngine(LLMEngine(tiny_llama))

    async def consume(i, p):
        toks, last = [], None
        async for out in engine.generate(f"req-{i}", p, sp):
            toks += out.new_token_ids
            last = out
        assert last.finished and last.token_ids == toks
        return toks

    async def main():
        return await asyncio.gather(*(consume(i, p) for i, p in enumerate(_prompts())))

    try:
        got = asyncio.run(main())
        assert got == ref
        s = engine.stats()
        assert s.max_batch_seqs > 1 and s.kv_usage == 0.0 and s.num_finished == 4
    finally:
        engine.shutdown()
    assert not engine.is_running


def test_breaking_out_of_the_stream_aborts_and_frees_blocks(tiny_llama):
    engine = AsyncEngine(LLMEngine(tiny_llama))
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

    async def main():
        seen = 0
        async for out in engine.generate("gone", _prompts()[3], long):
            seen += 1
            if seen == 2:
                assert engine.engine.pool.num_used > 0
                break  # the client went away
        await _wait_for(lambda: engine.stats().num_aborted == 1 and engine.stats().num_running == 0)
        s = engine.stats()
        assert s.kv_usage == 0.0 and s.num_generated_tokens < 200

        # Explicit abort: the stream ends with finish_reason "abort".
        outs = []

        async def consume():
            async for o in engine.generate("explicit", _prompts()[0], long):
                outs.append(o)

        task = asyncio.create_task(consume())
        await _wait_for(lambda: len(outs) >= 1)
        await engine.abort("explicit")
        await asyncio.wait_for(task, 10)
        assert outs[-1].finished and outs[-1].finish_reason == "abort"
        await _wait_for(lambda: engine.stats().kv_usage == 0.0)

        # Validation errors surface to the caller and never reach the engine loop.
        with pytest.raises(ConfigError, match="exceeds the context length"):
            async for _ in engine.generate("bad", [1] * 10, SamplingParams(max_tokens=10_000)):
                pass

    try:
        asyncio.run(main())
        assert engine.is_running
    finally:
        engine.shutdown()

    async def after_shutdown():
        async for _ in engine.generate("late", [1, 2], SamplingParams(max_tokens=2)):
            pass

    with pytest.raises(EngineDeadError):
        asyncio.run(after_shutdown())
