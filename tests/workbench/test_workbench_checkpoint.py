"""profile-run / profile-region from a checkpoint directory (--model) instead of a tiny family model."""

import json
import os
import subprocess
import sys

from torchinferno.cli.main import main


def test_profile_run_from_checkpoint_dir_and_region_without_source_run(tmp_path, capsys):
    from torchinferno.checkpoint.auto import save_pretrained
    from torchinferno.testing import tiny_model

    ckpt = tmp_path / "ckpt"
    save_pretrained(tiny_model("llama3", seed=1), ckpt)
    run = tmp_path / "run"
    assert main(["profile-run", str(run), "--model", str(ckpt), "--prompt-tokens", "4", "--new-tokens", "3",
                 "--cache-backend", "paged", "--no-graph"]) == 0
    cfg = json.loads((run / "run_config.json").read_text())
    assert cfg["model"] == str(ckpt) and cfg["model_kind"] is None and cfg["cache_backend"] == "paged"
    assert not (run / "graph.json").exists()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINFERNO_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, str(run / "repro.py")], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert main(["profile-region", str(tmp_path / "mlp"), "--model", str(ckpt), "--region", "model.layers.1.mlp",
                 "--iters", "2"]) == 0
    info = json.loads((tmp_path / "mlp" / "region_spec.json").read_text())
    assert info["module_class"] == "GatedMLP" and info["ok"] and info["full_graph_node_ids"]
