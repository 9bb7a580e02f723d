"""The timeline fit's device anchoring and the decode graph's host side read off the first-token iterations
(issue 21: run 45's C 1 TTFT was over-predicted because the fit priced a decode graph step as 5.3 ms of host time
where the step after a prefill shows ~0.9 ms)."""

import random

import pytest

from timeline_logs import EngineLoop, dec, pre  # tests/sim/timeline_logs.py (pytest puts this folder on sys.path)
from torchinferno.sim.timeline import TimelineModel
from torchinferno.sim.timeline_fit import Iteration, fit_timeline, graph_host_from_tail, replay_periods

MS = 1e-3
# device-bound decode (5 ms device, ~0.9 ms host), eager prefill launch 18 ms + 0.1 ms/row
DEVICE_BOUND = dict(host_step=0.8 * MS, host_seq=0.01 * MS, launch_eager=18 * MS, launch_eager_seq=0.1 * MS,
                    apply_row=0.02 * MS, weights=5 * MS, seq=0.01 * MS, batched=1 * MS, flop_token=0.012 * MS,
                    attn_pair=0.2 * MS)


def _log(model: TimelineModel, seed: int = 0, bursts: int = 16) -> list[Iteration]:
    """An async engine's loop under ``model``: a prefill (small or large, alone or among running decodes), then a
    run of decode steps, then an idle gap; loop overhead (a busy gap) before every step."""
    rng = random.Random(seed)
    loop = EngineLoop(model, rng, split=False)  # the fit of these options reads periods alone
    for _ in range(bursts):
        loop.idle(rng.uniform(0.05, 0.2))
        rows = rng.choice([1, 1, 4, 16, 64])
        tokens = rng.choice([128, 256, 2048, 4096])
        shapes = [pre(tokens, rows=1, decode_rows=rows - 1)] + [dec(rows) for _ in range(rng.randrange(20, 40))]
        loop.burst(shapes, (0.05, 0.15))
    return loop.its


def _rel(pred, its):
    return [abs(p - (it.end - it.start)) / (it.end - it.start) for p, it in zip(pred, its)]


def test_anchored_replay_is_exact_and_does_not_drift():
    truth = TimelineModel(DEVICE_BOUND, graphs=True, overlap=True, async_scheduling=True)
    its = _log(truth)
    assert max(_rel(replay_periods(its, truth, anchor=True), its)) < 1e-9
    assert max(_rel(replay_periods(its, truth), its)) < 1e-9
    slow = TimelineModel(dict(DEVICE_BOUND, weights=5.15 * MS), graphs=True, overlap=True)  # device 3% too slow
    free, anchored = _rel(replay_periods(its, slow), its), _rel(replay_periods(its, slow, anchor=True), its)
    assert max(anchored) < 0.05  # one step's error, re-anchored at every result
    assert max(free) > 0.3  # without anchors the device falls behind the measured starts step after step


def test_graph_host_read_off_first_token_iterations():
    truth = TimelineModel(DEVICE_BOUND, graphs=True, overlap=True, async_scheduling=True)
    host = graph_host_from_tail(_log(truth, seed=3), graphs=True)
    # one row after a one-row prefill: host_step + host_seq + the prefill's apply (one row)
    assert host["host_step"] == pytest.approx((0.8 + 0.01 + 0.02) * MS, rel=0.05)
    assert host["host_seq"] == pytest.approx(0.03 * MS, rel=0.1)  # per row: host_seq + the prefill rows' apply
    assert graph_host_from_tail(_log(truth), graphs=False) is None


@pytest.mark.parametrize("anchor_options", [{"anchor": True, "device_bound_graphs": True}])
def test_device_bound_fit_prices_the_first_token_step(anchor_options):
    """The fit with anchoring and the graph host side read off the log prices a decode step right after a small
    prefill (what a C 1 first token waits for) at its host time, and the steady decode at its device time."""
    truth = TimelineModel(DEVICE_BOUND, graphs=True, overlap=True, async_scheduling=True)
    its = _log(truth, seed=1)
    got, err = fit_timeline(its, graphs=True, overlap=True, weights="time", restarts=2, **anchor_options)
    assert err < 0.05
    p = got.params
    assert p["launch_graph"] == 0.0 and p["host_batched"] == 0.0
    pre_, launch, dev, _ = got.parts(dec(1))
    assert pre_ + launch < 1.5 * MS  # host side of the step after a prefill
    assert dev == pytest.approx(5 * MS, rel=0.05)  # the decode period is the device's
    for rows in (1, 16, 64):
        assert got.step_seconds(dec(rows)) == pytest.approx(truth.step_seconds(dec(rows)), rel=0.05), rows


def test_fixed_parameters_are_held_and_named():
    from torchinferno.errors import ConfigError

    truth = TimelineModel(DEVICE_BOUND, graphs=True, overlap=True, async_scheduling=True)
    its = _log(truth, seed=2, bursts=6)
    got, _ = fit_timeline(its, graphs=True, overlap=True, weights="time", restarts=0, anchor=True,
                          fixed={"host_step": 0.8 * MS, "launch_graph": 0.0})
    assert got.params["host_step"] == 0.8 * MS and got.params["launch_graph"] == 0.0
    default, _ = fit_timeline(its, graphs=True, overlap=True, weights="time", restarts=0)
    assert default.params["launch_eager_seq"] == 0.0  # the default fit keeps the per-row eager term out
    with pytest.raises(ConfigError):
        fit_timeline(its, graphs=True, overlap=True, fixed={"bogus": 1.0})
