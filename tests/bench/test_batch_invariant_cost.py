"""benchmarks/batch_invariant_cost.py runs end to end on a debug model on CPU: table, JSON, and its own check."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "batch_invariant_cost.py"


def test_batch_invariant_cost_script_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("batch_invariant_cost", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r.json"
    rc = mod.main(["--model-kind", "llama3", "--model-size", "debug", "--device", "cpu", "--dtype", "bfloat16",
                   "--concurrency", "1", "3", "--output-len", "4", "--input-len", "8", "--json-output", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["alone_equals_batched"] and set(r["tok_s"]) == {"plain", "batch_invariant"}
    assert all(v > 0 for mode in r["tok_s"].values() for v in mode.values())
    assert "invariant tok/s" in capsys.readouterr().out
