"""The waiting queue's order under EngineConfig.scheduling_policy: fcfs (arrival), sjf (shortest prompt first) and
priority (lower first), ties by arrival; a preempted request resumes before any of them; a bad name is refused."""

import pytest

from torchinferno.cache.block_pool import BlockPool
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.request import Request, RequestStatus
from torchinferno.engine.scheduler import Scheduler
from torchinferno.errors import ConfigError, SamplingError

# (id, prompt length, priority) in arrival order
ARRIVALS = [("a", 9, 2), ("b", 3, 1), ("c", 6, 0), ("d", 3, 1), ("e", 12, -1)]
EXPECTED = {"fcfs": "abcde", "sjf": "bdcae", "priority": "ecbda"}


def _admission_order(policy: str) -> str:
    cfg = EngineConfig(block_size=4, max_num_batched_tokens=64, max_num_seqs=1, enable_prefix_caching=False,
                       scheduling_policy=policy)
    sch = Scheduler(cfg, BlockPool(64, 4, False), max_model_len=64)
    for rid, n, prio in ARRIVALS:
        sch.add_request(Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=1, priority=prio)))
    order = ""
    while sch.waiting:
        out = sch.schedule()
        (s,) = out.scheduled  # max_num_seqs=1: one admission per step
        order += s.request_id
        sch.finish_request(s.request_id, RequestStatus.FINISHED_ABORTED)
    return order


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_admission_order(policy):
    assert _admission_order(policy) == EXPECTED[policy]


def test_preempted_request_stays_at_the_front_under_sjf():
    cfg = EngineConfig(block_size=4, max_num_batched_tokens=64, max_num_seqs=4, enable_prefix_caching=False,
                       scheduling_policy="sjf")
    sch = Scheduler(cfg, BlockPool(64, 4, False), max_model_len=64)
    long = Request("long", list(range(1, 13)), SamplingParams(max_tokens=1))
    long.status = RequestStatus.PREEMPTED
    sch.add_request(Request("x", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1)))
    sch.waiting.appendleft(long)  # as _preempt leaves it
    sch.requests["long"] = long
    sch.add_request(Request("short", [1], SamplingParams(max_tokens=1)))
    assert [r.request_id for r in sch.waiting] == ["long", "short", "x"]


def test_bad_policy_and_priority_are_refused():
    with pytest.raises(ConfigError, match="scheduling_policy must be one of fcfs, sjf, priority"):
        EngineConfig(scheduling_policy="lifo")
    with pytest.raises(SamplingError, match="priority must be an integer"):
        SamplingParams(priority=1.5).validate()
