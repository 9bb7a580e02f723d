"""profile-timeslice: the time-sliced replay follows its rules exactly; the README line writes its artifacts and a
standalone repro that reproduces the makespan."""

import json
import subprocess
import sys

import pytest

from torchinferno.errors import ConfigError
from torchinferno.workbench.timeslice import TimesliceConfig, replay_timeslice


def test_hand_computed_schedule():
    timeline, s = replay_timeslice([250.0, 100.0], time_slice_us=100.0, context_switch_us=10.0)
    # r0 0-100 (first slice: no switch); r1 switch 10 + 100 -> 210, finished; r0 switch + 100 -> 320;
    # r0 again (alone now: no switch) 320-370, finished.
    assert [(e["rank"], e["start_us"], e["end_us"], e["overhead_us"], e["work_left_us"]) for e in timeline] == [
        (0, 0.0, 100.0, 0.0, 150.0), (1, 100.0, 210.0, 10.0, 0.0), (0, 210.0, 320.0, 10.0, 50.0), (0, 320.0, 370.0, 0.0, 0.0)]
    assert s["makespan_us"] == 370.0 and s["total_overhead_us"] == 20.0 and s["context_switches"] == 2
    assert [r["completion_us"] for r in s["ranks"]] == [370.0, 210.0]
    assert s["device_busy_fraction"] == pytest.approx(350 / 370)


def test_ranks_without_work_and_a_lone_rank():
    timeline, s = replay_timeslice([0.0, 30.0], 10.0, 5.0)
    assert {e["rank"] for e in timeline} == {1} and s["total_overhead_us"] == 0 and s["makespan_us"] == 30.0
    assert s["ranks"][0]["completion_us"] == 0.0


def test_config_is_validated():
    with pytest.raises(ConfigError, match="virtual-gpus"):
        TimesliceConfig(virtual_gpus=0).validate()
    with pytest.raises(ConfigError, match="rank-work-scale"):
        TimesliceConfig(virtual_gpus=2, rank_work_scale=(1.0,)).validate()
    assert TimesliceConfig(2, profile_scale=4, rank_work_scale=(1.0, 0.5)).validate().rank_work(10.0) == [40.0, 20.0]


def test_readme_line_writes_artifacts_and_repro(tmp_path):
    from torchinferno.cli.main import main

    out = tmp_path / "dsv4-timeslice-cpu"
    assert main(["profile-timeslice", str(out), "--device", "cpu", "--iters", "1", "--virtual-gpus", "3"]) == 0
    for name in ("representative_output.json", "operator_profile.json", "chrome_trace.json", "timeslice_summary.json",
                 "timeslice_timeline.json", "memory_profile.json", "timeslice_repro.py", "manifest.json"):
        assert (out / name).exists(), name
    summary = json.loads((out / "timeslice_summary.json").read_text())
    assert summary["virtual_gpus"] == 3 and summary["makespan_us"] >= summary["total_work_us"] > 0
    r = subprocess.run([sys.executable, str(out / "timeslice_repro.py")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["match"] is True
