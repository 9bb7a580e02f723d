"""The engine core in its own process (``AsyncLLM``): same tokens as in-process, aborts cross the boundary,
a dead core fails every stream at once and never hangs."""

import asyncio
import os
import signal

import pytest

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.assembly import ModelSpec, build_model
from torchinferno.engine.async_llm import AsyncLLM, EngineDeadError
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError
from torchinferno.testing import wide_byte_tokenizer

SPEC = ModelSpec(model_kind="llama3", dtype="float32")
PROMPTS = [[5 + i, 17, 3 * i + 1, 40, 2] * (i + 1) for i in range(6)]


def _params(i: int) -> SamplingParams:
    if i % 3 == 2:  # seeded sampling must match too
        return SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=100 + i, ignore_eos=True)
    return SamplingParams(max_tokens=10 + i, temperature=0.0, ignore_eos=i % 2 == 0, stop=["A"] if i == 3 else [])


@pytest.fixture(scope="module")
def core_llm():
    llm = AsyncLLM(SPEC, EngineConfig(max_model_len=128, max_num_seqs=8), wide_byte_tokenizer())
    yield llm
    llm.shutdown()


async def _run(llm, rid, prompt, params):
    last = None
    async for out in llm.generate(rid, prompt, params):
        last = out
    return last


def test_outputs_equal_the_in_process_engine(core_llm):
    ref = LLMEngine(build_model(SPEC), wide_byte_tokenizer(), EngineConfig(max_model_len=128, max_num_seqs=8))
    for i, p in enumerate(PROMPTS):
        ref.add_request(f"r{i}", p, _params(i))
    want = ref.run_to_completion()

    async def main():
        return await asyncio.gather(*[_run(core_llm, f"r{i}", p, _params(i)) for i, p in enumerate(PROMPTS)])

    got = asyncio.run(main())
    for i, out in enumerate(got):
        w = want[f"r{i}"]
        assert (out.token_ids, out.text, out.finish_reason, out.stop_reason) == (w.token_ids, w.text, w.finish_reason,
                                                                               w.stop_reason), i
    assert core_llm.stats().num_finished >= len(PROMPTS)


def test_abort_frees_blocks_in_the_core(core_llm):
    async def main():
        params = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
        n = 0
        async for _ in core_llm.generate("long", list(range(3, 40)), params):
            n += 1
            if n == 3:
                break  # the consumer leaves: the request is aborted on the other side
        for _ in range(200):  # the core reports its stats with the next message
            await asyncio.sleep(0.02)
            s = core_llm.stats()
            if s.num_running == 0 and s.num_free_blocks == s.num_blocks:
                return s
        return core_llm.stats()

    s = asyncio.run(main())
    assert s.num_running == 0 and s.num_aborted >= 1
    assert s.num_free_blocks == s.num_blocks  # nothing held by a live request


def test_bad_request_is_refused_on_the_api_side(core_llm):
    async def main():
        async for _ in core_llm.generate("bad", [1, 2, 3], SamplingParams(max_tokens=500)):
            pass

    with pytest.raises(ConfigError, match="context length 128"):
        asyncio.run(main())
    assert core_llm.is_running


def test_startup_error_is_one_line():
    with pytest.raises(ConfigError, match="max_model_len=100000 exceeds"):
        AsyncLLM(SPEC, EngineConfig(max_model_len=100000), wide_byte_tokenizer())


def test_killed_core_fails_streams_at_once():
    llm = AsyncLLM(SPEC, EngineConfig(max_model_len=128, max_num_seqs=4), wide_byte_tokenizer())
    dead = []
    llm.on_dead = dead.append

    async def main():
        params = SamplingParams(max_tokens=110, temperature=0.0, ignore_eos=True)
        got = 0
        with pytest.raises(EngineDeadError):
            async for _ in llm.generate("x", [1, 2, 3], params):
                got += 1
                if got == 2:
                    os.kill(llm.core.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError):  # later requests are refused at once
            async for _ in llm.generate("y", [1, 2, 3], params):
                pass

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
        assert not llm.is_running and dead and "exited" in dead[0]
    finally:
        llm.shutdown()
    assert not llm.core.is_alive()
