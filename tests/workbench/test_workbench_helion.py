"""Helion as an optional provider: README flags, the one-line refusal, FX-window discovery, the shared gate
and the --remember decision log (CPU, a torch provider standing in for Helion), then Helion itself where installed."""

import importlib.util
import json

import pytest
import torch

from torchinferno.cli.main import build_parser, main
from torchinferno.errors import ConfigError
from torchinferno.workbench import helion as wh
from torchinferno.workbench.decisions import read_decisions, remember
from torchinferno.workbench.helion_templates import CandidateShape
from torchinferno.workbench.promotion import gate

HAS_HELION = importlib.util.find_spec("helion") is not None
README_LINES = [
    ["helion-candidate", "--candidate", "swiglu", "--device", "cuda"],
    ["helion-search-fx", "--candidate", "swiglu", "--batch-size", "1000", "--tokens", "32", "--hidden-size", "3584",
     "--max-nodes", "5", "--remember", "{dir}/helion-decisions.jsonl"],
    ["helion-search-region", "--model-kind", "deepseek", "--region", "attention", "--trace-device", "cpu", "--device", "cuda",
     "--max-nodes", "5"],
]


def _line(line, tmp_path):
    return [a.format(dir=tmp_path) for a in line]


@pytest.mark.parametrize("line", README_LINES, ids=lambda line: line[0])
def test_readme_lines_parse(line, tmp_path):
    a = build_parser().parse_args(_line(line, tmp_path))
    assert a.device == "cuda" and a.func.__name__.startswith("cmd_helion")


@pytest.mark.skipif(HAS_HELION, reason="checks the message on a host without Helion")
@pytest.mark.parametrize("line", README_LINES, ids=lambda line: line[0])
def test_without_helion_one_line_and_exit_1(line, tmp_path, capsys):
    assert main(_line(line, tmp_path)) == 1
    assert capsys.readouterr().err.strip().splitlines() == ["error: Helion is not installed (pip install helion; needs CUDA)"]
    assert not (tmp_path / "helion-decisions.jsonl").exists()


@pytest.mark.skipif(HAS_HELION, reason="checks the message on a host without Helion")
def test_candidate_provider_helion_refused_before_model_work(tmp_path, capsys):
    assert main(["candidate", str(tmp_path / "c"), "--provider", "helion", "--pattern", "swiglu", "--model-kind", "llama3"]) == 1
    assert capsys.readouterr().err.strip() == "error: Helion is not installed (pip install helion; needs CUDA)"


def test_search_fx_readme_shape_lists_one_swiglu_window(tmp_path, capsys):
    """Discovery traces on meta tensors: the README's 32000 x 7168 shape costs no memory; no Helion needed."""
    assert main([*_line(README_LINES[1], tmp_path), "--list-windows"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(w["pattern"], w["node_ids"], w["compute_nodes"]) for w in out["windows"]] == [("swiglu", [1, 2, 3, 4, 5], 3)]
    assert "rows=32000 hidden=3584" in out["source"] and out["decisions"] == []


def test_search_region_finds_the_attention_norms_within_max_nodes(capsys):
    assert main([*README_LINES[2], "--list-windows"]) == 0
    out = json.loads(capsys.readouterr().out)
    mods = [w["module"] for w in out["windows"]]
    assert mods == ["model.layers.0.self_attn.q_a_layernorm", "model.layers.0.self_attn.kv_a_layernorm"]
    assert all(w["pattern"] == "rms-norm" and w["compute_nodes"] == 5 for w in out["windows"])
    assert main([*README_LINES[2], "--list-windows", "--max-nodes", "4"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["windows"] == [] and len(small["too_large"]) == 2


def test_search_fx_on_a_run_limited_to_nodes(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["profile-run", str(run), "--model-kind", "llama3", "--prompt-tokens", "4", "--new-tokens", "1"]) == 0
    capsys.readouterr()
    assert main(["helion-search-fx", "--source-run", str(run), "--max-nodes", "5", "--list-windows"]) == 0
    everywhere = json.loads(capsys.readouterr().out)["windows"]
    assert {w["pattern"] for w in everywhere} == {"swiglu", "rms-norm"} and len(everywhere) == 2 + 5  # 2 MLPs, 5 norms
    first = everywhere[0]["node_ids"]
    assert main(["helion-search-fx", "--source-run", str(run), "--nodes", f"{first[0]}:{first[-1]}", "--list-windows"]) == 0
    assert [w["node_ids"] for w in json.loads(capsys.readouterr().out)["windows"]] == [first]


def _stand_in(tmp_path, **kw):
    """Search options with the torch-rewrite provider standing in for Helion on CPU (same gate, same log)."""
    return wh.SearchOptions(provider="torch-rewrite", device="cpu", iters=1, max_nodes=20,
                            remember=str(tmp_path / "decisions.jsonl"), **kw)


def test_every_window_goes_through_the_gate_and_is_remembered(tmp_path):
    shape = CandidateShape("fused-rmsnorm-swiglu", batch_size=2, tokens=4, hidden_size=32)
    opts = _stand_in(tmp_path, threshold=-0.999)  # any correct candidate passes
    s = wh.helion_search_fx(opts, shape=shape, out_dir=tmp_path / "out")
    assert [d["pattern"] for d in s["decisions"]] == ["fused-rmsnorm-swiglu", "rms-norm", "swiglu"]
    assert s["evaluated"] == 3 and s["accepted"] == 3
    lines = read_decisions(tmp_path / "decisions.jsonl")
    assert len(lines) == 3 and len({r["key"] for r in lines}) == 3
    for r in lines:
        assert r["correctness"]["passed"] and r["accepted"] == gate(r["correctness"], r["benchmark"], r["threshold"])[0]
        assert set(r["benchmark"]["baselines_us"]) == {"reference-graph", "custom-op"}
        assert r["inputs"] and r["device"] == "cpu" and r["provider"] == "torch-rewrite"
    report = json.loads((tmp_path / "out" / "search_report.json").read_text())
    assert [d["key"] for d in report["decisions"]] == [r["key"] for r in lines]

    again = wh.helion_search_fx(opts, shape=shape)  # same questions: reused, nothing appended
    assert again["remembered"] == 3 and again["evaluated"] == 0 and len(read_decisions(tmp_path / "decisions.jsonl")) == 3
    opts.refresh = True
    assert wh.helion_search_fx(opts, shape=shape)["evaluated"] == 3 and len(read_decisions(tmp_path / "decisions.jsonl")) == 6


def test_gate_rejects_slow_and_wrong_candidates(tmp_path, monkeypatch):
    from torchinferno.kernels import custom_ops

    shape = CandidateShape("swiglu", batch_size=1, tokens=4, hidden_size=16)
    slow = wh.helion_candidate(shape, _stand_in(tmp_path, threshold=1000.0))["decisions"][0]
    assert not slow["accepted"] and "below the required 1001.000x" in slow["reason"]
    op, ref = custom_ops.OPS["swiglu_activation"]
    monkeypatch.setitem(custom_ops.OPS, "swiglu_activation", (op, lambda g: ref(g) + 1.0))
    wrong = wh.helion_candidate(shape, _stand_in(tmp_path, threshold=-0.999, refresh=True))["decisions"][0]
    assert not wrong["accepted"] and "exceeds tolerance" in wrong["reason"] and wrong["max_abs_error"] >= 1.0


def test_promote_uses_the_same_gate():
    ok, why = gate({"passed": True, "max_abs_error": 0.0}, {"speedup_vs_best_baseline": 1.2, "best_baseline": "x"}, 0.05)
    assert ok and "1.200x" in why
    ok, why = gate({"passed": False, "max_abs_error": 0.5, "tolerance": 1e-5}, {"speedup_vs_best_baseline": 9.0}, 0.05)
    assert not ok and why == "max abs error 0.5 exceeds tolerance 1e-05"


def test_decision_log_errors_are_one_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"key": "a"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:2 is not a JSON decision line"):
        read_decisions(p)
    with pytest.raises(ConfigError, match="is a directory"):
        remember(tmp_path, {"key": "b"})


def test_bad_candidate_and_effort_are_config_errors(capsys):
    assert main(["helion-candidate", "--candidate", "gelu", "--list-windows"]) == 1
    assert "unknown Helion candidate 'gelu' (valid: swiglu, rms-norm, fused-rmsnorm-swiglu)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["helion-candidate", "--autotune-effort", "max"])


# ---------------------------------------------------------------- Helion itself (skipped where not installed)

needs_helion = pytest.mark.skipif(not HAS_HELION, reason="needs helion (pip install helion)")


@needs_helion
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_helion_kernels_match_the_torch_oracles_in_reference_mode(dtype):
    from torchinferno.kernels import helion_ops
    from torchinferno.kernels.reference import ref_rms_norm, ref_swiglu

    g = torch.Generator().manual_seed(0)
    gu = torch.randn(3, 5, 32, generator=g).to(dtype)
    x, w = torch.randn(6, 48, generator=g).to(dtype), (torch.rand(48, generator=g) + 0.5).to(dtype)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(helion_ops.swiglu_activation(gu, ref_mode=True), ref_swiglu(gu), atol=tol, rtol=tol)
    torch.testing.assert_close(helion_ops.rms_norm_op(x, w, 1e-6, ref_mode=True), ref_rms_norm(x, w, 1e-6), atol=tol, rtol=tol)


@needs_helion
def test_helion_generates_triton_for_both_kernels():
    from torchinferno.kernels import helion_ops

    sw = helion_ops.kernel_report("swiglu_activation", "none", torch.randn(4, 64))
    rn = helion_ops.kernel_report("rms_norm", "none", torch.randn(4, 48), torch.rand(48), 1e-6)
    for r in (sw, rn):
        assert "@triton.jit" in r["triton_code"] and r["config"].startswith("Config(")


@needs_helion
def test_helion_provider_end_to_end_in_reference_mode(tmp_path, monkeypatch):
    """The real Helion kernels (reference mode: eager, CPU) through the search, gate and log."""
    from torchinferno.kernels import helion_ops
    from torchinferno.workbench import candidates

    build = helion_ops.helion_kernel.__wrapped__
    monkeypatch.setattr(helion_ops, "helion_kernel", lambda name, effort="quick", ref_mode=False: build(name, effort, True))
    monkeypatch.setattr(helion_ops, "kernel_report", lambda op, effort, *a: {"kernel": op, "config": "ref", "triton_code": "#\n"})
    monkeypatch.setattr(candidates, "provider_available", lambda p, d: (True, ""))
    monkeypatch.setattr(wh, "require_helion", lambda d: None)
    opts = wh.SearchOptions(device="cpu", iters=1, max_nodes=20, autotune_effort="none", remember=str(tmp_path / "d.jsonl"))
    s = wh.helion_search_fx(opts, shape=CandidateShape("fused-rmsnorm-swiglu", 1, 8, 64), out_dir=tmp_path / "out")
    recs = read_decisions(tmp_path / "d.jsonl")
    assert len(recs) == 3 and all(r["correctness"]["passed"] and r["provider"] == "helion" for r in recs)
    assert all(r["provider_details"]["rewired_to_helion"] == 1 and r["kernels"] for r in recs)
    files = [k["file"] for r in recs for k in r["kernels"]]
    assert files and all((tmp_path / "out" / f).exists() for f in files) and s["evaluated"] == 3
    assert any(f.endswith("_swiglu_swiglu_activation.py") for f in files)  # helion_{window}_{pattern}_{kernel}.py


needs_gpu_helion = pytest.mark.skipif(not (HAS_HELION and torch.cuda.is_available()), reason="needs helion and CUDA")


@needs_gpu_helion
def test_helion_candidate_swiglu_on_cuda(tmp_path, capsys):
    log = tmp_path / "helion-decisions.jsonl"
    assert main(["helion-candidate", str(tmp_path / "out"), "--candidate", "swiglu", "--device", "cuda", "--tokens", "64",
                 "--hidden-size", "1024", "--autotune-effort", "none", "--iters", "5", "--remember", str(log)]) == 0
    (rec,) = read_decisions(log)
    assert rec["correctness"]["passed"] and rec["device"] == "cuda" and rec["kernels"][0]["kernel"] == "swiglu"
    assert (tmp_path / "out" / rec["kernels"][0]["file"]).read_text().count("@triton.jit") >= 1


@needs_gpu_helion
def test_helion_search_region_on_cuda(tmp_path, capsys):
    assert main([*README_LINES[2], "--autotune-effort", "none", "--iters", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["evaluated"] == 2 and all(d["pattern"] == "rms-norm" for d in out["decisions"])
    assert all(d["max_abs_error"] <= 1e-5 for d in out["decisions"])
