"""The split fit (``sim.timeline_split``): with each iteration's launch and wait measured (step_log_version 3), the
host terms are regressions and the device terms follow, so a host-bound and a device-bound engine with the same
decode period are told apart (issue 21: the default fit on served logs came out host-bound either way)."""

import json
import random
from dataclasses import asdict

import pytest

from timeline_logs import EngineLoop, dec, pre  # tests/sim/timeline_logs.py
from torchinferno.errors import ConfigError
from torchinferno.sim.timeline import TimelineModel
from torchinferno.sim.timeline_fit import Iteration, fit_timeline, iterations_from_step_log, replay_periods
from torchinferno.sim.timeline_split import host_from_split

MS = 1e-3
# the same ~5.1 ms one-row decode period, once bound by the device and once by the host
DEVICE_BOUND = dict(host_step=0.8 * MS, host_seq=0.01 * MS, launch_eager=18 * MS, launch_graph=0.2 * MS,
                    apply_row=0.02 * MS, weights=5 * MS, seq=0.01 * MS, batched=1 * MS, flop_token=0.012 * MS,
                    attn_pair=0.2 * MS)
HOST_BOUND = dict(DEVICE_BOUND, host_step=4.1 * MS, launch_graph=1.0 * MS, weights=1.2 * MS)


def _log(model: TimelineModel, seed: int = 0, bursts: int = 14, split: bool = True) -> list[Iteration]:
    rng = random.Random(seed)
    loop = EngineLoop(model, rng, split=split)
    for _ in range(bursts):
        loop.idle(rng.uniform(0.05, 0.2))
        rows = rng.choice([1, 1, 4, 16, 64])
        shapes = [pre(rng.choice([128, 256, 2048]), decode_rows=rows - 1)]
        shapes += [dec(rows) for _ in range(rng.randrange(20, 40))]
        loop.burst(shapes, (0.05, 0.15))
    return loop.its


@pytest.mark.parametrize("truth", [DEVICE_BOUND, HOST_BOUND], ids=["device-bound", "host-bound"])
def test_split_fit_recovers_host_and_device_sides(truth):
    model = TimelineModel(truth, graphs=True, overlap=True, async_scheduling=True)
    its = _log(model)
    host = host_from_split(its, graphs=True)
    # launch times give each launch kind's sum with host_step (the split between them is a convention: only an
    # eager step's device start depends on it)
    for kind in ("launch_graph", "launch_eager"):
        assert host["host_step"] + host[kind] == pytest.approx(truth["host_step"] + truth[kind], rel=0.02), kind
    for k in ("host_seq", "apply_row"):
        assert host[k] == pytest.approx(truth[k], rel=0.02), k
    got, err = fit_timeline(its, graphs=True, overlap=True, weights="time", restarts=2, split=True)
    assert err < 0.05
    assert {k: got.params[k] for k in host} == host  # held
    fresh = _log(model, seed=7)  # another log of the same engine, predicted from its measured starts
    for p, it in zip(replay_periods(fresh, got), fresh):
        assert p == pytest.approx(it.end - it.start, rel=0.03, abs=2e-5)
    if truth is DEVICE_BOUND:  # the device time shows in the waits; a host-bound engine hides it (any less fits)
        for shape in (dec(1), dec(16), pre(128), pre(256, decode_rows=3)):
            assert got.step_seconds(shape) == pytest.approx(model.step_seconds(shape), rel=0.05), shape
    else:
        assert got.parts(dec(1))[2] <= model.parts(dec(1))[0] + model.parts(dec(1))[1]


def test_without_the_split_the_two_engines_are_confused():
    """The control: the same two logs without launch/wait give fits that price one engine's decode device time
    wrongly (the replay cannot tell the stories apart), so the test above can fail."""
    worst = 0.0
    for truth in (DEVICE_BOUND, HOST_BOUND):
        model = TimelineModel(truth, graphs=True, overlap=True, async_scheduling=True)
        got, _ = fit_timeline(_log(model), graphs=True, overlap=True, weights="time", restarts=2)  # split off
        want = model.parts(dec(1))[2]
        worst = max(worst, abs(got.parts(dec(1))[2] - want) / want)
    assert worst > 0.2


def test_split_needs_measurements_and_step_log_rows_carry_them():
    model = TimelineModel(DEVICE_BOUND, graphs=True, overlap=True, async_scheduling=True)
    its = _log(model, split=False, bursts=3)
    assert host_from_split(its, graphs=True) is None
    with pytest.raises(ConfigError, match="launch/wait"):
        fit_timeline(its, graphs=True, overlap=True, split=True, restarts=0)
    rows = [{"t": 1.0, "dt": 0.006, "gap": 0.0004, "idle": 0.0001, "step": 3, "resolved": 2, "launch": 0.001,
             "wait": 0.004, "seqs": 1, "tokens": 1, "decode_seqs": 1, "decode_ctx": 10, "decode_ctx_max": 10}]
    (it,) = iterations_from_step_log(rows)
    assert it.launch == pytest.approx(0.0013) and it.wait == 0.004  # the busy gap belongs to the launch side
    assert it.end - it.start == pytest.approx(0.0063)


def _write_log(path, its, with_split: bool = True) -> None:
    """A version-3 step log of these iterations, as the core process of a CUDA-graph engine writes it."""
    meta = {"step_log_version": 3, "async_scheduling": True, "block_size": 16, "num_blocks": 4096,
            "max_model_len": 8192, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "enable_prefix_caching": True,
            "engine": "runner=cuda-graphs, async scheduling", "device": "cuda:0", "model": "synthetic"}
    lines, prev_end = [json.dumps({"meta": meta})], None
    for it in its:
        gap = None if prev_end is None else it.start - prev_end
        row = {"t": it.start, "dt": it.end - it.start, "gap": gap, "idle": gap or 0.0, "outputs": 0, "arrivals": 0,
               "step": it.launched[1] if it.launched else None, "resolved": it.resolved[1] if it.resolved else None,
               "launch": it.launch if with_split else None, "wait": it.wait if with_split else None}
        if it.shape is not None:
            row.update(asdict(it.shape), running=it.shape.seqs, waiting=0)
        lines.append(json.dumps(row))
        prev_end = it.end
    path.write_text("\n".join(lines) + "\n")


def test_sim_calibrate_split_option(tmp_path, capsys):
    from torchinferno.cli.main import main

    model = TimelineModel(DEVICE_BOUND, graphs=True, overlap=True, async_scheduling=True)
    its = _log(model, bursts=6)
    log, cal = tmp_path / "steps.jsonl", tmp_path / "cal.json"
    _write_log(log, its)
    assert main(["sim-calibrate", "--from-step-log", str(log), "--out", str(cal), "--timeline-fit", "split"]) == 0
    tl = json.loads(cal.read_text())["timeline"]
    assert tl["fit_options"] == {"split": True}
    p = tl["params"]
    assert p["host_step"] + p["launch_graph"] == pytest.approx(1.0e-3, rel=0.02)  # 0.8 + 0.2 ms, as logged
    assert p["weights"] == pytest.approx(5e-3, rel=0.02)  # the decode device time the waits show
    _write_log(log, its, with_split=False)  # an older log: one clear line, no calibration
    capsys.readouterr()
    assert main(["sim-calibrate", "--from-step-log", str(log), "--out", str(tmp_path / "x.json"),
                 "--timeline-fit", "split"]) != 0
    assert "launch/wait" in capsys.readouterr().err
