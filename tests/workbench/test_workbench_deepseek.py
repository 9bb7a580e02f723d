"""The same workbench on the DeepSeek-style families through the family contract (each skipped if absent)."""

import json
import os
import subprocess
import sys

import pytest

from torchinferno.errors import ConfigError


def _family_or_skip(name):
    from torchinferno.models.registry import get_family

    try:
        return get_family(name)
    except (ConfigError, ImportError) as e:
        pytest.skip(f"{name} family not available: {e}")


@pytest.mark.parametrize("family", ["deepseek", "dsv4"])
def test_family_profile_run_repro_and_pattern(tmp_path, family):
    _family_or_skip(family)
    from torchinferno.cli.main import main

    run = tmp_path / "run"
    assert main(["profile-run", str(run), "--model-kind", family, "--batch-size", "1", "--prompt-tokens", "4",
                 "--new-tokens", "2"]) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    for a in manifest["artifacts"]:
        assert (run / a["file"]).exists()
        if a["file"].endswith(".json"):
            json.loads((run / a["file"]).read_text())
    assert json.loads((run / "graph.json").read_text())["max_abs_diff_vs_eager"] <= 1e-5
    env = {k: v for k, v in os.environ.items() if k != "TORCHINFERNO_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, str(run / "repro.py")], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1])["match"], proc.stderr[-2000:]
    out = tmp_path / "pat"
    assert main(["profile-pattern", str(out), "--source-run", str(run), "--pattern", "fused-rmsnorm-swiglu", "--iters", "1"]) == 0
    cmp = json.loads((out / "comparison.json").read_text())
    assert cmp["replaced"] >= 1 and cmp["ok"]  # the dense layers' gated MLPs (MoE experts do not match)
