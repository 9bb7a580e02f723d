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


def test_triton_provider_without_triton_or_gpu_is_one_line(tmp_path, capsys):
    import torch

    if importlib.util.find_spec("triton") is not None and torch.cuda.is_available():
        pytest.skip("Triton and a GPU present: the provider applies")
    assert main(["candidate", str(tmp_path / "t"), "--model-kind", "llama3", "--provider", "triton"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    want = "triton candidates need --device cuda" if importlib.util.find_spec("triton") else "triton is not installed"
    assert len(err) == 1 and want in err[0], err


# ---------------------------------------------------------------- promoted variants build and run


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """Default registry location (<TORCHINFERNO_CACHE_DIR>/promoted_variants.json) inside tmp_path."""
    monkeypatch.setenv("TORCHINFERNO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _logits(model, ids):
    import torch

    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids))))


def test_promoted_variant_builds_with_its_ops_module(candidate, cache_dir, monkeypatch, capsys):
    import torch

    from torchinferno.models.llama3 import custom_ops_ops
    from torchinferno.models.registry import get_family

    rec = promote(candidate, name="v1-cop", threshold=-0.99)  # default registry: under the tmp cache dir
    assert (cache_dir / "promoted_variants.json").exists()
    assert rec["ops_module"] == "torchinferno.models.llama3.custom_ops_ops" and rec["fallback"] == "v1"
    assert rec["class_path"] == "torchinferno.models.llama3.v1:Llama3V1"

    fam = get_family("llama3")
    cfg = fam.size("debug")
    ref = fam.build(cfg, device="cpu", variant="v0")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    model = fam.build(cfg, device="cpu", variant="v1-cop")
    model.load_state_dict(ref.state_dict())
    assert model.ops is custom_ops_ops and model.model.layers[0].mlp.ops is custom_ops_ops

    calls = {"silu_and_mul": 0, "rms_norm": 0}
    real_swiglu, real_norm = torch.ops.torchinferno.swiglu_activation, torch.ops.torchinferno.rms_norm

    def count(name, fn):
        def wrapped(*a):
            calls[name] += 1
            return fn(*a)
        return wrapped

    monkeypatch.setattr(custom_ops_ops, "silu_and_mul", count("silu_and_mul", custom_ops_ops.silu_and_mul))
    monkeypatch.setattr(custom_ops_ops, "add_rms_norm", count("rms_norm", custom_ops_ops.add_rms_norm))
    ids = torch.randint(0, cfg.vocab_size, (7,), generator=torch.Generator().manual_seed(1))
    got, want = _logits(model, ids), _logits(ref, ids)
    assert calls["silu_and_mul"] == cfg.num_hidden_layers and calls["rms_norm"] >= cfg.num_hidden_layers
    assert real_swiglu is torch.ops.torchinferno.swiglu_activation and real_norm is torch.ops.torchinferno.rms_norm
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    assert main(["model-variants", "--family", "llama3", "--lineage", "v1-cop"]) == 0
    assert capsys.readouterr().out.strip() == "llama3: v1-cop -> v1 -> v0"
    assert main(["validate-model-variants", "--family", "llama3", "--json-output", str(cache_dir / "v.json")]) == 0
    res = {r["variant"]: r for r in json.loads((cache_dir / "v.json").read_text())["results"]}
    assert res["v1-cop"]["ok"] and res["v1-cop"]["status"] == "promoted" and res["v1"]["ok"]


def _write_record(reg, name, ops_module, parent="v1"):
    data = json.loads(reg.read_text()) if reg.exists() else {"version": 1, "families": {}}
    data["families"].setdefault("llama3", {})[name] = {
        "name": name, "family": "llama3", "parent": parent, "fallback": parent, "status": "promoted",
        "class_path": "torchinferno.models.llama3.v1:Llama3V1", "ops_module": ops_module, "notes": "test record",
        "candidate_dir": "-", "benchmark": {}}
    reg.parent.mkdir(parents=True, exist_ok=True)
    reg.write_text(json.dumps(data))


def test_missing_ops_module_falls_back_to_parent_with_a_warning(tmp_path, capsys):
    from torchinferno.models.llama3 import fused_ops
    from torchinferno.models.promoted import using_registry
    from torchinferno.models.registry import get_family

    reg = tmp_path / "r.json"
    _write_record(reg, "v1-gone", "torchinferno.models.llama3.no_such_ops")
    fam = get_family("llama3")
    with using_registry(reg), pytest.warns(RuntimeWarning, match="building its parent 'v1'"):
        model = fam.build(fam.size("debug"), device="cpu", variant="v1-gone")
    assert type(model).__name__ == "Llama3V1" and model.ops is fused_ops
    # validation reports that the promoted variant would only run as its parent
    assert main(["validate-model-variants", "--family", "llama3", "--variant", "v1-gone", "--registry", str(reg)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_wrong_override_fails_validation(tmp_path, monkeypatch, capsys):
    import sys
    import types

    from torchinferno.models.llama3 import fused_ops

    bad = types.ModuleType("ti_test_wrong_ops")
    bad.__dict__.update({k: v for k, v in vars(fused_ops).items() if not k.startswith("__")})
    bad.silu_and_mul = lambda gate_up: fused_ops.silu_and_mul(gate_up) * 1.05
    monkeypatch.setitem(sys.modules, bad.__name__, bad)
    reg = tmp_path / "r.json"
    _write_record(reg, "v1-wrong", bad.__name__)
    _write_record(reg, "v1-rewrite", "torchinferno.models.llama3.torch_rewrite_ops")
    out_json = tmp_path / "v.json"
    assert main(["validate-model-variants", "--family", "llama3", "--registry", str(reg), "--json-output", str(out_json)]) == 1
    res = {r["variant"]: r for r in json.loads(out_json.read_text())["results"]}
    assert not res["v1-wrong"]["ok"] and res["v1-wrong"]["rel_err"] > 1e-3
    assert res["v1-rewrite"]["ok"] and res["v1"]["ok"]
    assert "2/3 variants match v0" in capsys.readouterr().out


def test_torch_compile_candidate_is_refused_at_promotion(llama_run, tmp_path):
    from torchinferno.workbench.candidates import run_candidate

    run_candidate(tmp_path / "tc", "torch-compile", None, llama_run, backend="eager", iters=2)
    with pytest.raises(ConfigError, match="torch-compile candidates are not promotable"):
        promote(tmp_path / "tc", threshold=-0.99, registry=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
