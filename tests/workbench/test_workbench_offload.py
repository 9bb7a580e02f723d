"""profile-offload: decoder layers staged from host memory give the resident model's tokens (every family, with and
without activation offload, from a checkpoint too); the README line writes its artifacts and a working repro."""

import json
import subprocess
import sys

import pytest

from torchinferno.workbench.offload import OffloadConfig, profile_offload
from torchinferno.workbench.run_config import RunConfig


@pytest.mark.parametrize("kind,act", [("llama3", False), ("deepseek", True), ("dsv4", False)])
def test_offloaded_equals_resident(tmp_path, kind, act):
    cfg = RunConfig(model_kind=kind, device="cpu", prompt_tokens=6, new_tokens=4, batch_size=2)
    m = profile_offload(tmp_path / kind, cfg, OffloadConfig(warmup=0, iters=1, activation_offload=act))
    assert m["summary"]["match_resident"] is True
    s = json.loads((tmp_path / kind / "offload_summary.json").read_text())
    ev = json.loads((tmp_path / kind / "offload_events.json").read_text())["events"]
    layers = s["offloaded_layers"]
    # one prefill + 3 decode forwards, each stages and computes every layer once
    assert sum(e["kind"] == "compute" for e in ev) == 4 * layers
    assert sum(e["kind"] == "stage" for e in ev) >= 4 * layers - 1
    assert (s["activation_movement_us_per_iter"] > 0) == act and s["bytes_staged_per_iter"] > 0


def test_readme_line_and_checkpoint(tmp_path):
    from torchinferno.cli.main import main
    from torchinferno.testing import tiny_model

    out = tmp_path / "dsv4-offload-cpu"
    assert main(["profile-offload", str(out), "--device", "cpu", "--iters", "1"]) == 0
    for name in ("offload_summary.json", "offload_events.json", "output.json", "input_ids.json", "offload_repro.py"):
        assert (out / name).exists(), name
    r = subprocess.run([sys.executable, str(out / "offload_repro.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["match"] is True

    ckpt = tmp_path / "ckpt"
    tiny_model("llama3").save_pretrained(ckpt)
    assert main(["profile-offload", str(tmp_path / "ck"), "--checkpoint", str(ckpt), "--device", "cpu",
                 "--prompt-tokens", "16", "--new-tokens", "1", "--warmup", "1", "--iters", "2"]) == 0
    assert json.loads((tmp_path / "ck" / "output.json").read_text())["match_resident"] is True


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind,act", [("llama3", False), ("deepseek", True), ("dsv4", False)])
def test_offloaded_equals_resident_on_cuda(tmp_path, kind, act):
    """The side-stream staging on a GPU: the resident model's tokens, every layer staged and computed once per
    forward, staging timed by CUDA events (the copy stream's time is positive and the bytes add up)."""
    cfg = RunConfig(model_kind=kind, device="cuda", prompt_tokens=6, new_tokens=4, batch_size=2)
    m = profile_offload(tmp_path / kind, cfg, OffloadConfig(warmup=1, iters=2, activation_offload=act))
    assert m["summary"]["match_resident"] is True
    s = json.loads((tmp_path / kind / "offload_summary.json").read_text())
    ev = json.loads((tmp_path / kind / "offload_events.json").read_text())["events"]
    assert s["bytes_staged_per_iter"] > 0 and all(e["end_us"] >= e["start_us"] for e in ev)
    assert any(e["kind"] == "stage" and e["end_us"] > e["start_us"] for e in ev)
