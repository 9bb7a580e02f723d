"""Scheduler state under async scheduling, driven by hand (no model): in-flight tokens count in a
request's length, a preempted request still receives its in-flight token (and can finish while
WAITING), results of finished or id-reused requests are dropped, and a second unapplied step is
refused."""

from __future__ import annotations

import pytest

from torchinferno.cache.block_pool import BlockPool
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.outputs import PLACEHOLDER_TOKEN, ModelRunnerOutput, SchedulerOutput
from torchinferno.engine.request import Request, RequestStatus
from torchinferno.engine.scheduler import Scheduler


def _sp(n: int, stop=()) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, stop_token_ids=list(stop))


def _scheduler(num_blocks: int) -> Scheduler:
    cfg = EngineConfig(block_size=4, max_num_batched_tokens=64, max_num_seqs=8, enable_prefix_caching=False)
    return Scheduler(cfg, BlockPool(num_blocks, 4, False), max_model_len=64)


def _add(sch: Scheduler, rid: str, prompt: list[int], params: SamplingParams) -> Request:
    req = Request(rid, prompt, params, frozenset(params.stop_token_ids))
    sch.add_request(req)
    return req


def _result(sched: SchedulerOutput, token: int = 9) -> ModelRunnerOutput:
    return ModelRunnerOutput(sampled_token_ids={s.request_id: token for s in sched.scheduled if s.sample})


@pytest.mark.parametrize("case", ["length", "stop", "continues"])
def test_preempted_request_gets_its_in_flight_token(case):
    sch = _scheduler(3)
    a = _add(sch, "a", list(range(1, 9)), _sp(10))  # 2 blocks
    b = _add(sch, "b", [1, 2, 3], {"length": _sp(1), "stop": _sp(5, stop=[9]), "continues": _sp(5)}[case])
    s1 = sch.schedule()  # both prefill and sample: the pool is full
    assert [s.request_id for s in s1.scheduled] == ["a", "b"]
    assert a.num_inflight == b.num_inflight == 1 and sch.pool.num_free == 0
    # Step 2 before step 1's result: a decodes its in-flight token (a placeholder) at position 8,
    # which needs a third block; b, the latest arrival, is preempted for it with its token in flight.
    s2 = sch.schedule()
    assert s2.preempted_ids == ["b"] and b.status is RequestStatus.PREEMPTED and b.num_inflight == 1
    (sa,) = s2.scheduled
    assert sa.request_id == "a" and sa.token_ids == [PLACEHOLDER_TOKEN] and sa.num_computed_tokens == 8 and sa.sample
    assert a.num_inflight == 2 and a.num_computed_tokens == 9
    results = {r.request.request_id: r for r in sch.update_from_output(s1, _result(s1))}
    assert b.output_token_ids == [9] and b.num_inflight == 0 and a.num_inflight == 1
    if case == "continues":
        assert not results["b"].finished and b in sch.waiting and b.status is RequestStatus.PREEMPTED
    else:
        assert results["b"].finished and b not in sch.waiting and "b" not in sch.requests
        assert b.status is (RequestStatus.FINISHED_LENGTH if case == "length" else RequestStatus.FINISHED_STOPPED)
    sch.update_from_output(s2, _result(s2))
    assert a.output_token_ids == [9, 9] and a.num_inflight == 0 and a.num_computed_tokens == 9


def test_in_flight_token_counts_in_length_limits_and_one_step_in_flight():
    sch = _scheduler(8)
    a = _add(sch, "a", [1, 2, 3], _sp(2))
    s1 = sch.schedule()
    s2 = sch.schedule()  # the decode of a's first token: it will sample a's 2nd and last token
    assert s2.scheduled[0].token_ids == [PLACEHOLDER_TOKEN]
    sch.update_from_output(s1, _result(s1))
    assert sch.schedule().scheduled == []  # outputs + in-flight reach max_tokens: not scheduled
    (res,) = sch.update_from_output(s2, _result(s2))
    assert res.finished and a.status is RequestStatus.FINISHED_LENGTH and sch.pool.num_free == 8
    # A second unapplied step would need the token of a step two back: refused.
    _add(sch, "b", [1, 2, 3], _sp(10))
    sch.schedule()
    sch.schedule()
    with pytest.raises(RuntimeError, match="in flight"):
        sch.schedule()


def test_results_of_finished_and_reused_ids_are_dropped():
    sch = _scheduler(8)
    old = _add(sch, "r", [1, 2, 3], _sp(10))
    s1 = sch.schedule()
    sch.finish_request("r", RequestStatus.FINISHED_ABORTED)  # aborted while s1 is in flight
    new = _add(sch, "r", [4, 5], _sp(10))
    s2 = sch.schedule()
    assert s2.finished_ids == ["r"] and s2.scheduled[0].arrival_index == new.arrival_index != old.arrival_index
    assert sch.update_from_output(s1, _result(s1, 7)) == []  # old r's token: dropped
    assert new.output_token_ids == [] and new.num_inflight == 1
    (res,) = sch.update_from_output(s2, _result(s2, 8))
    assert res.request is new and new.output_token_ids == [8]
