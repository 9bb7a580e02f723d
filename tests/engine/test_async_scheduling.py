"""Async scheduling (``EngineConfig.async_scheduling``): step k+1 is scheduled and launched before
step k's sampled tokens reach the host, which fills them on the device. Every output must equal
the synchronous engine's: tokens, finish and stop reasons, text, logprobs, seeded samples,
through stops, preemption, prefix hits, chunked prefill, aborts and late arrivals."""

from __future__ import annotations

import time

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine import graph_runner
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError
from torchinferno.testing import wide_byte_tokenizer
from torchinferno.text.byte_tokenizer import ByteTokenizer


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **({"ignore_eos": True} | kw))


def _prompts(lens=(7, 1, 33, 4, 20, 17), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (n,), generator=g).tolist() for n in lens]


class _Spy:
    """Counts placeholder fills per runner step (and whether the step was mixed prefill/decode)."""

    def __init__(self, engine: LLMEngine):
        self.filled_steps = self.filled_tokens = self.mixed_filled_steps = 0
        inner = engine.runner.inputs.prepare

        def prepare(reqs, prev_rows=None):
            step = inner(reqs, prev_rows)
            if step.fill_dst is not None:
                self.filled_steps += 1
                self.filled_tokens += step.fill_dst.numel()
                self.mixed_filled_steps += int(step.num_tokens > step.num_seqs)
            return step

        engine.runner.inputs.prepare = prepare


def _check_between_steps(engine: LLMEngine) -> None:
    """Invariants that hold whenever ``step()`` returned."""
    reqs = engine.scheduler.requests.values()
    assert all(0 <= r.num_inflight <= 1 for r in reqs)
    assert all(r.num_inflight == 0 for r in engine.scheduler.waiting)  # applied before any re-admission
    if not engine.config.async_scheduling:
        assert engine.core._inflight is None and all(r.num_inflight == 0 for r in reqs)


def _drive(engine: LLMEngine, prompts, params, stagger=False, stream=None):
    """Submit (all at once, or one per step) and run; final outputs in order. ``stream`` collects
    every output per request."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    final = {}

    def take(outs):
        for o in outs:
            if stream is not None:
                stream.setdefault(o.request_id, []).append(o)
            if o.finished:
                assert o.request_id not in final
                final[o.request_id] = o
        _check_between_steps(engine)

    for i, (p, sp) in enumerate(zip(prompts, plist)):
        engine.add_request(f"r{i}", p, sp)
        if stagger:
            take(engine.step())
    while engine.has_unfinished():
        take(engine.step())
    assert engine.pool.num_used == 0 and engine.core._inflight is None and not engine.scheduler.requests
    return [final[f"r{i}"] for i in range(len(prompts))]


def _key(o):
    return o.token_ids, o.finish_reason, o.stop_reason, o.text, o.completion_tokens


def _logprobs(stream: list) -> list | None:
    """The logprobs of a request's whole stream (each output carries those of its new tokens)."""
    if stream[0].logprobs is None and not stream[0].new_token_ids:
        stream = stream[1:]
    if all(o.logprobs is None for o in stream):
        return None
    return [lp for o in stream for lp in (o.logprobs or [])]


def _sync_and_async(model, prompts, params, tokenizer=None, stagger=False, **cfg):
    """Run both engines; outputs must be equal. -> (want, got, async engine, spy, streams)."""
    streams = ({}, {})
    sync = LLMEngine(model, tokenizer, EngineConfig(**cfg))
    want = _drive(sync, prompts, params, stagger, streams[0])
    eng = LLMEngine(model, tokenizer, EngineConfig(**cfg, async_scheduling=True))
    spy = _Spy(eng)
    got = _drive(eng, prompts, params, stagger, streams[1])
    assert [_key(o) for o in got] == [_key(o) for o in want]
    for rid, stream in streams[1].items():
        assert [t for o in stream for t in o.new_token_ids] == stream[-1].token_ids
        w, g = _logprobs(streams[0][rid]), _logprobs(stream)
        assert (w is None) == (g is None)
        if g is not None:
            assert len(g) == len(stream[-1].token_ids)
            for a, b in zip(w, g):
                assert (a.token_id, a.top_token_ids) == (b.token_id, b.top_token_ids)
                assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
                assert b.top_logprobs == pytest.approx(a.top_logprobs, abs=1e-5)
    return want, got, eng, spy, streams


# ------------------------------------------------------------------------------ equality with sync
@pytest.mark.parametrize("stagger", [False, True])
def test_ragged_prompts_mixed_max_tokens_and_late_arrivals(tiny_llama, stagger):
    params = [_greedy(3 + 4 * i) for i in range(6)]
    _, got, eng, spy, _ = _sync_and_async(tiny_llama, _prompts(), params, stagger=stagger)
    assert [len(o.token_ids) for o in got] == [3 + 4 * i for i in range(6)]
    assert spy.filled_steps > 0 and spy.filled_tokens > 20  # decodes really took device-side tokens
    assert eng.stats().num_generated_tokens == sum(3 + 4 * i for i in range(6))


def test_one_step_in_flight_and_outputs_one_step_later(tiny_llama):
    eng = LLMEngine(tiny_llama, async_scheduling=True)
    eng.add_request("a", [5, 6, 7], _greedy(2))
    assert eng.step() == [] and eng.has_unfinished()  # prefill launched, nothing applied yet
    assert eng.scheduler.requests["a"].num_inflight == 1
    first = eng.step()  # decode launched with a placeholder; the prefill's token applied
    assert [len(o.new_token_ids) for o in first] == [1] and not first[0].finished
    # Token 2 is the last: the request is not scheduled again, the next step only applies it.
    last = eng.step()
    assert last[0].finished and last[0].finish_reason == "length" and len(last[0].token_ids) == 2
    assert not eng.has_unfinished() and eng.step() == []
    ref = LLMEngine(tiny_llama)
    ref.add_request("a", [5, 6, 7], _greedy(2))
    assert ref.run_to_completion()["a"].token_ids == last[0].token_ids
    assert eng.stats().num_forward_calls == ref.stats().num_forward_calls == 2


def test_step_timing_splits_launch_from_the_wait_on_the_previous_result(tiny_llama):
    """With ``record_shapes`` (the step log), each async step reports how long it spent launching its batch and how
    long it blocked on the previous batch's result: a result that takes 30 ms to arrive is counted as wait."""
    eng = LLMEngine(tiny_llama, async_scheduling=True)
    core = eng.core
    core.record_shapes = True
    inner = core.executor.execute_async

    class _Late:  # the previous batch's result arrives 30 ms after it is asked for
        def __init__(self, handle):
            self.handle = handle

        def result(self):
            time.sleep(0.03)
            return self.handle.result()

    core.executor.execute_async = lambda sched: _Late(inner(sched))
    eng.add_request("a", [5, 6, 7], _greedy(3))
    t0 = time.perf_counter()
    assert eng.step() == []
    dt = time.perf_counter() - t0
    assert core.last_wait_s is None and 0 <= core.last_launch_s <= dt  # nothing resolved yet
    eng.step()
    assert core.last_wait_s >= 0.03 and core.last_launch_s < 0.03
    eng.core.record_shapes = False
    eng.step()
    assert core.last_wait_s >= 0.03  # untimed steps leave the fields alone (the step log resets them)


class _EosTokenizer(ByteTokenizer):
    """A byte tokenizer whose eos is a token the tiny model really produces."""

    def __init__(self, eos: int):
        super().__init__()
        self._eos = eos

    @property
    def eos_token_ids(self) -> list[int]:
        return [self._eos]


def test_stop_tokens_and_eos_hit_mid_stream(tiny_llama):
    prompts = _prompts()
    free = _drive(LLMEngine(tiny_llama), prompts, _greedy(16))
    params = []
    for i, o in enumerate(free):
        stop_at = o.token_ids[2 + i % 5]  # a token the greedy run actually produces, mid-stream
        params.append(_greedy(16, stop_token_ids=[stop_at]))
    eos = free[1].token_ids[6]
    params[1] = SamplingParams(max_tokens=16, temperature=0.0)  # stops at the (tokenizer's) eos
    params[4] = _greedy(16, stop_token_ids=[free[4].token_ids[0]])  # stops on its very first token
    _, got, _, spy, _ = _sync_and_async(tiny_llama, prompts, params, tokenizer=_EosTokenizer(eos))
    assert sum(o.finish_reason == "stop" for o in got) >= 5
    assert got[1].finish_reason == "stop" and got[1].stop_reason == eos and got[1].token_ids[-1] == eos
    assert len(got[1].token_ids) <= 7 and got[1].token_ids == free[1].token_ids[: len(got[1].token_ids)]
    assert got[4].token_ids == free[4].token_ids[:1] and got[4].stop_reason == free[4].token_ids[0]
    assert spy.filled_steps > 0


def test_stop_strings_finish_requests_whose_next_step_is_in_flight(tiny_llama):
    tok = wide_byte_tokenizer()
    prompts = _prompts((9, 3, 21, 14), seed=5)
    free = _drive(LLMEngine(tiny_llama, tok), prompts, _greedy(24))
    params = [_greedy(24, stop=[o.text[3 + i : 5 + i]]) for i, o in enumerate(free)]
    params[2] = _greedy(24)
    _, got, eng, _, _ = _sync_and_async(tiny_llama, prompts, params, tokenizer=tok, max_num_batched_tokens=8)
    assert [o.stop_reason for o in got].count("stop_string") == 3
    # Each stopped request's next step was already launched; its result was dropped.
    assert eng.stats().num_computed_tokens > sum(len(p) + len(o.token_ids) - 1 for p, o in zip(prompts, got))


def test_preemption_with_tokens_in_flight(tiny_llama):
    prompts = _prompts((30, 25, 40, 18, 33, 27, 22, 36), seed=3)
    cfg = {"num_gpu_blocks": 8, "max_model_len": 128, "max_num_batched_tokens": 64}
    eng = LLMEngine(tiny_llama, None, EngineConfig(**cfg, async_scheduling=True))
    victims_in_flight = []
    preempt = eng.scheduler._preempt

    def spy_preempt(req):
        victims_in_flight.append(req.num_inflight)
        preempt(req)

    eng.scheduler._preempt = spy_preempt
    got = _drive(eng, prompts, _greedy(24))
    want = _drive(LLMEngine(tiny_llama, None, EngineConfig(**cfg)), prompts, _greedy(24))
    assert [_key(o) for o in got] == [_key(o) for o in want]
    assert eng.stats().num_preemptions > 0
    assert any(victims_in_flight)  # a preempted request's in-flight token was applied while it waited
    assert [o.token_ids for o in got] == [o.token_ids for o in _drive(LLMEngine(tiny_llama), prompts, _greedy(24))]


def test_prefix_cache_hits(tiny_llama):
    base = _prompts((40,), seed=1)[0]
    other = base[:32] + _prompts((9,), seed=2)[0]
    engines = [LLMEngine(tiny_llama, async_scheduling=a) for a in (False, True)]
    outs = []
    for eng in engines:
        _drive(eng, [base], _greedy(12))
        eng.add_request("hit", other, _greedy(12))
        eng.add_request("again", base[:32], _greedy(12))
        fin = eng.run_to_completion()
        outs.append([(fin[k].token_ids, fin[k].num_cached_tokens) for k in ("hit", "again")])
    assert outs[0] == outs[1]
    assert outs[1][0][1] == 32 and outs[1][1][1] == 16
    assert engines[1].stats().prefix_hits == engines[0].stats().prefix_hits
    assert engines[1].pool.num_used == 0


def test_chunked_prefill_mixed_steps_with_device_filled_decodes(tiny_llama):
    params = [_greedy(10 + i) for i in range(6)]
    _, _, eng, spy, _ = _sync_and_async(tiny_llama, _prompts(), params, stagger=True, max_num_batched_tokens=5)
    assert eng.stats().max_batch_tokens <= 5
    assert spy.mixed_filled_steps > 0  # placeholders filled in steps that also ran prefill chunks


def test_seeded_sampling_and_logprobs(tiny_llama):
    ps = _prompts()
    params = [SamplingParams(max_tokens=10, temperature=0.7, top_k=20, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=123, ignore_eos=True, logprobs=3),
              _greedy(8, logprobs=2),
              SamplingParams(max_tokens=12, temperature=1.3, min_p=0.05, seed=5, ignore_eos=True),
              _greedy(6),
              SamplingParams(max_tokens=9, temperature=0.9, seed=11, logprobs=0)]
    _, got, _, spy, streams = _sync_and_async(tiny_llama, ps, params, stagger=True, max_num_batched_tokens=16)
    lps = [_logprobs(streams[1][f"r{i}"]) for i in range(6)]
    assert [lp is not None for lp in lps] == [False, True, True, False, False, True]
    assert [lp.token_id for lp in lps[1]] == got[1].token_ids
    assert len(lps[1][0].top_token_ids) == 3 and lps[5][0].top_token_ids == []
    assert spy.filled_steps > 0


def test_abort_in_flight_and_request_id_reuse(tiny_llama):
    prompts = _prompts()
    ref = _drive(LLMEngine(tiny_llama), prompts, _greedy(12))
    eng = LLMEngine(tiny_llama, async_scheduling=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, _greedy(12))
    seen: dict[str, list] = {}
    for _ in range(4):
        for o in eng.step():
            seen.setdefault(o.request_id, []).append(o)
    sched = eng.core._inflight[0]
    assert "r2" in [s.request_id for s in sched.scheduled]  # its next step is in flight
    used = eng.pool.num_used
    assert eng.abort_request("r2") and not eng.abort_request("r2")
    assert eng.pool.num_used < used  # blocks freed at once
    # Reuse the id at once with another prompt: the in-flight result of the old r2 must not leak in.
    eng.add_request("r2", prompts[0], _greedy(5))
    final = {}
    outs = eng.step()
    aborted = [o for o in outs if o.request_id == "r2" and o.finished]
    assert len(aborted) == 1 and aborted[0].finish_reason == "abort"
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                final[o.request_id] = o
    assert final["r2"].token_ids == ref[0].token_ids[:5] and final["r2"].finish_reason == "length"
    assert [final[f"r{i}"].token_ids for i in (0, 1, 3, 4, 5)] == [ref[i].token_ids for i in (0, 1, 3, 4, 5)]
    assert eng.pool.num_used == 0 and eng.stats().num_aborted == 1
    # Abort everything while a step is in flight: nothing leaks, the engine goes idle.
    for i, p in enumerate(prompts):
        eng.add_request(f"s{i}", p, _greedy(12))
    eng.step()
    eng.step()
    for i in range(6):
        eng.abort_request(f"s{i}")
    assert eng.pool.num_used == 0
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert sorted(o.request_id for o in outs) == [f"s{i}" for i in range(6)]
    assert all(o.finish_reason == "abort" for o in outs) and not eng.scheduler.requests


def test_graph_runner_steps_with_device_filled_tokens_on_cpu(tiny_llama, monkeypatch):
    """The CUDA-graph runner's decode path (its padded buffers run eagerly without CUDA) with
    async scheduling equals the eager synchronous engine."""
    monkeypatch.setattr(graph_runner, "can_use_cuda_graphs", lambda model, kv: True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
               for _ in range(9)]
    params = [_greedy(4 + (i * 5) % 13) for i in range(9)]
    params[3] = _greedy(9, logprobs=2)  # forces eager steps among the replayed ones
    kw = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "block_size": 4, "max_model_len": 64}
    eng = LLMEngine(tiny_llama, None, EngineConfig(**kw, async_scheduling=True))
    assert isinstance(eng.runner, graph_runner.CudaGraphModelRunner)
    spy = _Spy(eng)
    got = _drive(eng, prompts, params, stagger=True)
    want = _drive(LLMEngine(tiny_llama, None, EngineConfig(**kw, enforce_eager=True)), prompts, params, stagger=True)
    assert [_key(o) for o in got] == [_key(o) for o in want]
    s = eng.stats()
    assert 0 < s.num_graph_steps < s.num_forward_calls and spy.filled_steps >= s.num_graph_steps // 2


def test_async_engine_thread_serves_an_async_scheduling_engine(tiny_llama):
    import asyncio

    from torchinferno.engine.async_engine import AsyncEngine

    prompts = _prompts()[:4]
    ref = _drive(LLMEngine(tiny_llama), prompts, _greedy(16))
    server = AsyncEngine(LLMEngine(tiny_llama, async_scheduling=True))

    async def consume(i, p, stop_after=None):
        toks = []
        async for out in server.generate(f"q{i}", p, _greedy(16)):
            toks += out.new_token_ids
            if stop_after is not None and len(toks) >= stop_after:
                break  # client disconnect: aborts a request whose next step is in flight
        return toks

    async def main():
        return await asyncio.gather(*(consume(i, p, 3 if i == 2 else None) for i, p in enumerate(prompts)))

    try:
        got = asyncio.run(main())
        assert [got[i] for i in (0, 1, 3)] == [ref[i].token_ids for i in (0, 1, 3)]
        assert got[2] == ref[2].token_ids[: len(got[2])] and len(got[2]) >= 3
        eng = server.engine
        for _ in range(200):  # the abort is applied by the engine thread
            if server.stats().num_aborted == 1 and server.stats().kv_usage == 0.0:
                break
            time.sleep(0.01)
        assert server.stats().num_aborted == 1 and server.stats().kv_usage == 0.0 and eng.config.async_scheduling
    finally:
        server.shutdown()


# ------------------------------------------------------------------------------ config and flags
def test_config_and_flags(capsys):
    with pytest.raises(ConfigError, match="async_scheduling"):
        EngineConfig(async_scheduling="yes")
    assert EngineConfig().async_scheduling is None  # the device decides: on for CUDA, off on CPU
    assert EngineConfig().for_device("cpu").async_scheduling is False
    assert EngineConfig().for_device("cuda").async_scheduling is True
    assert EngineConfig(async_scheduling=False).for_device("cuda").async_scheduling is False
    from torchinferno.cli.main import main

    assert main(["serve-smoke", "--num-requests", "3", "--max-tokens", "4", "--async-scheduling"]) == 0
    out = capsys.readouterr().out
    assert "OK: 3/3" in out and "async scheduling" in out

    import argparse

    from torchinferno.server.launch import add_server_args

    p = argparse.ArgumentParser()
    add_server_args(p)
    assert p.parse_args(["--async-scheduling"]).async_scheduling is True
    assert p.parse_args(["--no-async-scheduling"]).async_scheduling is False
    assert p.parse_args([]).async_scheduling is None


# ------------------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("stagger", [False, True])
def test_graphs_with_async_scheduling_equal_sync_cuda(stagger):
    from torchinferno.kernels import triton as tri

    if not tri.available():
        pytest.skip("needs Triton")
    from torchinferno.models.common.attention_triton import TritonPagedAttention
    from torchinferno.testing import tiny_model

    model = tiny_model("llama3", device="cuda", attention_backend=TritonPagedAttention)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
               for _ in range(19)]
    params = [_greedy(4 + (i * 5) % 17) for i in range(19)]
    params[3] = _greedy(9, logprobs=2)
    params[5] = SamplingParams(max_tokens=11, temperature=0.8, seed=3, ignore_eos=True)
    params[7] = _greedy(12, stop_token_ids=[7, 11, 13])
    kw = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 4, "max_model_len": 64}
    eng = LLMEngine(model, None, EngineConfig(**kw, async_scheduling=True))
    assert isinstance(eng.runner, graph_runner.CudaGraphModelRunner)
    spy = _Spy(eng)
    got = _drive(eng, prompts, params, stagger)
    for sync_cfg in (EngineConfig(**kw), EngineConfig(**kw, enforce_eager=True)):
        want = _drive(LLMEngine(model, None, sync_cfg), prompts, params, stagger)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    s = eng.stats()
    assert 0 < s.num_graph_steps < s.num_forward_calls and spy.filled_steps > 0
