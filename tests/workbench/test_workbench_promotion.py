"""Candidate -> promotion loop: artifacts, the promotion gate (correct + faster by a threshold),
persisted JSON registry, and promoted variants in model-variants listings/lineage."""

import importlib.util
import json
import shutil

import pytest

from torchinferno.cli.main import main
from torchinferno.errors import ConfigError
from torchinferno.workbench.promotion import lineages, promote, variant_rows

CANDIDATE_FILES = ("partition.json", "provider.json", "correctness.json", "benchmark.json", "repro.py", "manifest.json")


@pytest.fixture(scope="module")
def candidate(llama_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("cand") / "custom-op"
    assert main(["candidate", str(out), "--source-run", str(llama_run), "--pattern", "fused-rmsnorm-swiglu",
                 "--provider", "custom-op", "--iters", "3"]) == 0
    return out


def test_candidate_writes_all_artifacts(candidate):
    for name in CANDIDATE_FILES:
        assert (candidate / name).exists(), name
    part = json.loads((candidate / "partition.json").read_text())
    assert part["family"] == "llama3" and part["pattern"] == "fused-rmsnorm-swiglu" and len(part["sites"]) == 2
    corr = json.loads((candidate / "correctness.json").read_text())
    assert corr["passed"] and corr["max_abs_error"] <= 1e-5
    bench = json.loads((candidate / "benchmark.json").read_text())
    assert set(bench["baselines_us"]) == {"reference-graph", "eager-forward"} and bench["candidate_us"] > 0
    assert bench["best_baseline"] == min(bench["baselines_us"], key=bench["baselines_us"].get)


def test_promotion_gate_and_model_variants(candidate, tmp_path, capsys):
    reg = tmp_path / "promoted.json"
    with pytest.raises(ConfigError, match="not promoted: .* below the required"):
        promote(candidate, threshold=1000.0, registry=reg)  # must be 1001x faster: never
    assert not reg.exists()
    # a threshold of -0.99 accepts anything not 100x slower: the gate itself is what is tested here
    rec = promote(candidate, name="v1-fused-mlp", threshold=-0.99, registry=reg)
    assert rec["parent"] == "v1" and rec["fallback"] == "v1" and rec["status"] == "promoted"
    data = json.loads(reg.read_text())
    assert "v1-fused-mlp" in data["families"]["llama3"]
    rows = {r["variant"]: r for r in variant_rows("llama3", reg)}
    assert rows["v1-fused-mlp"]["status"] == "promoted" and rows["v1-fused-mlp"]["parent"] == "v1"
    assert {"v0", "v1"} <= set(rows)
    assert lineages("v1-fused-mlp", "llama3", reg) == {"llama3": ["v1-fused-mlp", "v1", "v0"]}
    capsys.readouterr()
    assert main(["model-variants", "--family", "llama3", "--lineage", "v1-fused-mlp", "--registry", str(reg)]) == 0
    assert capsys.readouterr().out.strip() == "llama3: v1-fused-mlp -> v1 -> v0"
    assert main(["model-variants", "--family", "llama3", "--registry", str(reg)]) == 0
    assert "v1-fused-mlp" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="built-in"):
        promote(candidate, name="v1", threshold=-0.99, registry=reg)


def test_incorrect_candidate_is_refused(candidate, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(candidate, bad)
    corr = json.loads((bad / "correctness.json").read_text())
    corr.update(passed=False, max_abs_error=0.5)
    (bad / "correctness.json").write_text(json.dumps(corr))
    with pytest.raises(ConfigError, match="exceeds tolerance"):
        promote(bad, threshold=-0.99, registry=tmp_path / "r.json")


def test_torch_rewrite_provider_uses_plain_torch(llama_run, tmp_path):
    from torchinferno.workbench.candidates import run_candidate

    run_candidate(tmp_path / "rw", "torch-rewrite", "fused-rmsnorm-swiglu", llama_run, iters=2)
    prov = json.loads((tmp_path / "rw" / "provider.json").read_text())
    assert prov["rewired_to_reference"] == 2
    assert json.loads((tmp_path / "rw" / "correctness.json").read_text())["passed"]


def test_torch_compile_provider_on_the_whole_forward(llama_run, tmp_path):
    from torchinferno.workbench.candidates import run_candidate

    m = run_candidate(tmp_path / "tc", "torch-compile", None, llama_run, backend="eager", iters=2)
    assert m["summary"]["partition"] == {"kind": "forward"} and m["summary"]["passed"]
    assert json.loads((tmp_path / "tc" / "provider.json").read_text())["backend"] == "eager"


@pytest.mark.skipif(importlib.util.find_spec("helion") is not None, reason="Helion installed")
@pytest.mark.parametrize("cmd", ["helion-candidate", "helion-search-fx", "helion-search-region"])
def test_helion_commands_say_not_installed(cmd, capsys):
    assert main([cmd]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Helion is not installed" in err[0]


@pytest.mark.skipif(importlib.util.find_spec("triton") is not None, reason="Triton installed")
def test_triton_provider_not_installed_is_one_line(tmp_path, capsys):
    assert main(["candidate", str(tmp_path / "t"), "--model-kind", "llama3", "--provider", "triton"]) == 1
    assert "triton is not installed" in capsys.readouterr().err
