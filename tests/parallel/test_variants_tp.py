"""``validate-model-variants --include-tensor-parallel``: tp-v0 of every family (v0 over 2 gloo ranks) == v0."""

import json

from torchinferno.cli.main import main


def test_tp_v0_of_every_family_matches_v0(tmp_path, capsys):
    out = tmp_path / "tp.json"
    assert main(["validate-model-variants", "--include-tensor-parallel", "--variant", "tp-v0", "--rtol", "1e-5",
                 "--json-output", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert {r["family"] for r in rows} == {"llama3", "deepseek-v3.2", "dsv4", "deepseek-v4"}
    assert all(r["ok"] and r["parent"] == "v0" and r["tensor_parallel"] == 2 and r["rel_err"] <= 1e-5 for r in rows)
    assert all(0 < r["max_abs_err"] for r in rows)  # computed through the world (reduction order differs from TP=1)
    assert "4/4 variants match v0" in capsys.readouterr().out


def test_a_failing_world_is_a_failed_row(monkeypatch, capsys):
    from torchinferno.parallel import checks

    def boom(*a, **k):
        raise RuntimeError("rank 1 died")

    monkeypatch.setattr(checks, "tp_report", boom)
    assert main(["validate-model-variants", "--family", "dsv4", "--include-tensor-parallel"]) == 1
    assert "rank 1 died" in capsys.readouterr().out
