"""Lone graph prefill (engine.scheduler, EngineConfig.graph_prefill_alone): a lone waiting fresh prompt that a
prefill graph replays gets a step of its own while the decodes wait one step; anything else (two prompts, a cached
prefix, prompt logprobs, a prompt longer than the graphs) mixes as before. Outputs never change; the simulator's
replica (a timeline model with prefill graphs) makes the same steps."""

import pytest
import torch

from torchinferno.cache.block_pool import BlockPool
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.engine.generate import generate
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.engine.request import Request
from torchinferno.engine.scheduler import Scheduler
from torchinferno.errors import ConfigError

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _sched(lone: int, prefix_caching: bool = False) -> Scheduler:
    cfg = EngineConfig(block_size=4, max_num_batched_tokens=64, max_num_seqs=8, enable_prefix_caching=prefix_caching)
    sch = Scheduler(cfg, BlockPool(64, 4, prefix_caching), max_model_len=64)
    sch.lone_prefill_tokens = lone
    return sch


def _decoding(sch: Scheduler, *ids: str) -> None:
    """Admit ``ids`` (8-token prompts) and apply their first step, so each next schedules a decode."""
    from torchinferno.engine.outputs import ModelRunnerOutput

    for rid in ids:
        sch.add_request(Request(rid, list(range(1, 9)), SamplingParams(max_tokens=8)))
    sched = sch.schedule()
    sch.update_from_output(sched, ModelRunnerOutput(sampled_token_ids={s.request_id: 7 for s in sched.scheduled}))


def _rows(sched) -> list[tuple[str, int]]:
    return [(s.request_id, len(s.token_ids)) for s in sched.scheduled]


def test_a_lone_prompt_runs_alone_and_the_decodes_next():
    sch = _sched(lone=16)
    _decoding(sch, "a", "b")
    sch.add_request(Request("p", list(range(20, 32)), SamplingParams(max_tokens=4)))
    assert _rows(sch.schedule()) == [("p", 12)]
    assert sch.num_lone_prefills == 1 and not sch.waiting
    assert _rows(sch.schedule()) == [("a", 1), ("b", 1), ("p", 1)]  # all decode (p: its in-flight token)


@pytest.mark.parametrize("case", ["off", "two waiting", "too long", "prompt logprobs", "no decodes"])
def test_otherwise_the_prompt_mixes_with_the_decodes(case):
    sch = _sched(lone=0 if case == "off" else 16)
    if case != "no decodes":
        _decoding(sch, "a", "b")
    n = 20 if case == "too long" else 12
    plp = 1 if case == "prompt logprobs" else None
    sch.add_request(Request("p", list(range(20, 20 + n)), SamplingParams(max_tokens=4, prompt_logprobs=plp)))
    if case == "two waiting":
        sch.add_request(Request("q", [3, 4, 5], SamplingParams(max_tokens=4)))
    rows = _rows(sch.schedule())
    assert ("p", n) in rows and sch.num_lone_prefills == 0
    assert len(rows) == {"two waiting": 4, "no decodes": 1}.get(case, 3)


def test_a_cached_prefix_mixes():
    """A prefix hit leaves cached context: no prefill graph replays that, so the prompt joins the decodes."""
    sch = _sched(lone=64, prefix_caching=True)
    _decoding(sch, "a")
    from torchinferno.engine.outputs import ModelRunnerOutput

    sched = sch.schedule()  # a's decode registers its first two full blocks (tokens 1..8)
    sch.update_from_output(sched, ModelRunnerOutput(sampled_token_ids={"a": 7}))
    sch.add_request(Request("p", list(range(1, 9)) + [40, 41, 42], SamplingParams(max_tokens=2)))
    rows = _rows(sch.schedule())
    assert ("p", 3) in rows and ("a", 1) in rows and sch.num_lone_prefills == 0


def test_config_flag_is_checked():
    with pytest.raises(ConfigError, match="graph_prefill_alone must be True or False"):
        EngineConfig(graph_prefill_alone="yes")


def _prompts(lens=(7, 1, 33, 4, 20, 17), seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (n,), generator=g).tolist() for n in lens]


def test_lone_prefill_steps_change_no_output(tiny_llama):
    """Prompts joining one per step: with lone prefill steps (as a runner with prefill graphs gets them) the tokens
    equal plain generation, and the lone steps really ran."""
    ref = [r.token_ids for r in generate(tiny_llama, _prompts(), GREEDY)]
    for lone in (0, 64):
        eng = LLMEngine(tiny_llama, config=EngineConfig(enable_prefix_caching=False))
        eng.core.scheduler.lone_prefill_tokens = lone
        final = {}
        for i, p in enumerate(_prompts()):
            eng.add_request(f"r{i}", p, GREEDY)
            final.update({o.request_id: o for o in eng.step() if o.finished})
        final.update(eng.run_to_completion())
        assert [final[f"r{i}"].token_ids for i in range(6)] == ref
        assert (eng.core.scheduler.num_lone_prefills > 0) == bool(lone)


def test_the_core_takes_the_limit_from_its_executor():
    """EngineCore sets the scheduler's limit from the executor's prefill graphs unless the config turns it off; the
    simulated executor reports the timeline model's."""
    from torchinferno.sim.executor import SimulatedExecutor
    from torchinferno.sim.timeline import TimelineModel

    tl = TimelineModel(dict(host_step=1e-3, launch_graph=1e-4, launch_eager=1e-2, weights=1e-3),
                       graphs=True, overlap=True, prefill_graph_tokens=256, piecewise_graph_tokens=128)
    assert EngineCore(SimulatedExecutor(tl, EngineConfig(), num_blocks=64)).scheduler.lone_prefill_tokens == 256
    assert SimulatedExecutor(tl, EngineConfig(), num_blocks=64).piecewise_graph_tokens == 128  # step-log meta
    off = EngineConfig(graph_prefill_alone=False)
    assert EngineCore(SimulatedExecutor(tl, off, num_blocks=64)).scheduler.lone_prefill_tokens == 0
    eager = TimelineModel(tl.params, graphs=False, overlap=True, prefill_graph_tokens=256)
    assert EngineCore(SimulatedExecutor(eager, EngineConfig(), num_blocks=64)).scheduler.lone_prefill_tokens == 0
