"""perf-smoke is also a numerical check (exit 1 when a row is wrong) and reports no speedup where the
"specialized" path is the torch reference itself (CPU)."""

import json

import torch

from torchinferno.cli.main import main

SMALL = ["perf-smoke", "--device", "cpu", "--seq-len", "40", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
         "--iters", "1"]


def _result(capsys) -> tuple[str, dict]:
    out = capsys.readouterr().out
    return out, json.loads(out.strip().splitlines()[-1])


def test_cpu_reports_no_speedup_of_the_reference_against_itself(capsys):
    assert main([*SMALL, "--dtype", "bfloat16"]) == 0
    out, res = _result(capsys)
    assert res["ok"] and res["speedup_vs_reference"] is None and res["specialized_kernel"] is False
    assert "speedup" not in out.replace("no speedup", "").replace("speedup_vs_reference", "")
    assert "is the torch reference path itself" in out
    assert all(r["check"] == "ok" for r in res["rows"])


def test_a_wrong_kernel_fails_the_smoke(capsys, monkeypatch):
    from torchinferno.kernels import api

    real = api.batched_paged_decode_attention
    monkeypatch.setattr(api, "batched_paged_decode_attention", lambda *a, **k: real(*a, **k) * 1.5)
    assert main([*SMALL, "--dtype", "float32"]) == 1
    out, res = _result(capsys)
    assert not res["ok"] and res["failed"] == ["specialized (api)"]
    assert "numerical check FAILED: specialized (api)" in out


def test_nan_fails_the_smoke(capsys, monkeypatch):
    from torchinferno.kernels import api

    monkeypatch.setattr(api, "batched_paged_decode_attention", lambda q, *a, **k: torch.full_like(q, float("nan")))
    assert main([*SMALL, "--dtype", "float32"]) == 1
    assert _result(capsys)[1]["failed"] == ["specialized (api)"]
