"""sim.first_token: following requests through a step log to their first token, and the client's finish latency
in the driver (issue 21: the replayed refill delay holds the previous request's last-token trip)."""

import pytest

from torchinferno.sim.first_token import finish_latency_for, follow_requests
from timeline_logs import one_second_steps  # tests/sim/timeline_logs.py (pytest puts this folder on sys.path)


def _row(t, dt, step, resolved, seqs=0, dec=0, pre=0, arrivals=0, idle=0.0, gap=0.0):
    return {"t": t, "dt": dt, "gap": gap, "idle": idle, "step": step, "resolved": resolved, "arrivals": arrivals,
            "seqs": seqs, "decode_seqs": dec, "prefill_tokens": pre, "tokens": dec + pre, "running": 0, "waiting": 0}


def test_follow_requests_async_and_a_cut_prompt():
    rows = [
        _row(1.0, 0.020, 1, None, seqs=1, pre=64, arrivals=1, idle=0.5),  # r0's prefill launched from idle
        _row(1.021, 0.001, 2, 1, seqs=1, dec=1),  # r0's first token: this iteration takes batch 1's result
        _row(1.030, 0.030, 3, 2, seqs=3, dec=1, pre=99, arrivals=2),  # r1 whole, r2 cut at the 100-token budget
        _row(1.061, 0.025, 4, 3, seqs=2, dec=1, pre=40),  # r2's last chunk; r1's first token here
        _row(1.087, 0.001, 5, 4, seqs=3, dec=3),  # r2's first token
    ]
    r0, r1, r2 = follow_requests(rows, budget=100)
    assert r0.arrival == 1.0 and r0.first_sched == 1.0 and r0.prefill_end == pytest.approx(1.02)
    assert r0.first_token == pytest.approx(1.022)
    assert r1.arrival == pytest.approx(0.5 * (1.021 + 1.030))  # mid of the window it landed in
    assert r1.first_token == pytest.approx(1.086) and r1.prefill_end == pytest.approx(1.06)
    assert r2.first_sched == pytest.approx(1.030) and r2.prefill_end == pytest.approx(1.086)
    assert r2.first_token == pytest.approx(1.088)


def test_finish_latency_delays_the_next_send_not_the_tokens():
    plain, late = (one_second_steps(2, 3, max_concurrency=1, finish_latency_s=fin) for fin in (0.0, 0.5))
    assert late[0].last_s == plain[0].last_s and late[0].finish_s == plain[0].finish_s + 0.5
    assert late[1].send_s == late[0].finish_s  # the closed loop refills the slot when the client is done
    assert late[1].first_s - late[1].send_s == pytest.approx(plain[1].first_s - plain[1].send_s)
    assert finish_latency_for({"1": 0.001, "64": 0.02}, 50) == 0.02 and finish_latency_for(None, 4) == 0.0
