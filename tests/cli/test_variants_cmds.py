"""validate-model-variants: every family's v1 matches v0; a deliberately broken variant (registered
through the family's VARIANTS dict) fails with a non-zero exit; bad flags are one-line errors."""

import json
import sys
import types

import pytest

from torchinferno.cli.main import main
from torchinferno.models.llama3 import raw_ops as llama_raw_ops
from torchinferno.models.llama3 import registry as llama_registry
from torchinferno.models.dsv4 import raw_ops as dsv4_raw_ops
from torchinferno.models.dsv4 import registry as dsv4_registry
from torchinferno.models.variants import Variant


def test_all_families_v1_match_v0(tmp_path, capsys):
    out_json = tmp_path / "v" / "variants.json"
    assert main(["validate-model-variants", "--json-output", str(out_json)]) == 0
    out = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    rows = {(r["family"], r["variant"]): r for r in data["results"]}
    assert {("llama3", "v1"), ("deepseek-v3.2", "v1"), ("dsv4", "v1")} <= set(rows) and data["ok"]
    assert all(r["ok"] and r["rel_err"] <= 1e-3 and r["parent"] == "v0" for r in rows.values())
    assert "3/3 variants match v0" in out or f"{len(rows)}/{len(rows)} variants match v0" in out


def _broken_module(name, base_cls, raw_ops, scale):
    """A module holding a variant class whose ops scale every RMSNorm output by ``scale``."""
    ops = types.ModuleType(f"{name}_ops")
    ops.__dict__.update({k: getattr(raw_ops, k) for k in dir(raw_ops) if not k.startswith("__")})
    ops.rms_norm = lambda x, w, eps: raw_ops.rms_norm(x, w, eps) * scale
    ops.add_rms_norm = lambda x, r, w, eps: (lambda y, h: (y * scale, h))(*raw_ops.add_rms_norm(x, r, w, eps))
    mod = types.ModuleType(name)

    class Broken(base_cls):
        def __init__(self, config, **kw):
            kw.pop("attention_backend", None)
            super().__init__(config, ops=ops)

    mod.Broken = Broken
    return mod


@pytest.mark.parametrize("family,registry,raw_ops,cls_path", [
    ("llama3", llama_registry, llama_raw_ops, "torchinferno.models.llama3.model:Llama3ForCausalLM"),
    ("dsv4", dsv4_registry, dsv4_raw_ops, "torchinferno.models.dsv4.model:DSv4ForCausalLM"),
])
def test_broken_variant_fails(family, registry, raw_ops, cls_path, monkeypatch, tmp_path, capsys):
    module, cls = cls_path.split(":")
    base = getattr(__import__(module, fromlist=[cls]), cls)
    mod = _broken_module("ti_test_broken_variant", base, raw_ops, 1.01)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(registry.VARIANTS, "v_broken", Variant(
        name="v_broken", parent="v0", class_path=f"{mod.__name__}:Broken", ops_module=f"{mod.__name__}_ops",
        status="experimental", notes="deliberately perturbed (test)"))
    out_json = tmp_path / "r.json"
    assert main(["validate-model-variants", "--family", family, "--json-output", str(out_json)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "v_broken" in ln)
    assert "FAIL" in line and "1/2 variants match v0" in out
    res = {r["variant"]: r for r in json.loads(out_json.read_text())["results"]}
    assert res["v1"]["ok"] and not res["v_broken"]["ok"] and res["v_broken"]["rel_err"] > 1e-3
    # a loose enough tolerance accepts the perturbation: the check is the tolerance, not the name
    assert main(["validate-model-variants", "--family", family, "--variant", "v_broken", "--rtol", "0.5"]) == 0


def test_variant_that_raises_is_a_failed_row(monkeypatch, capsys):
    mod = types.ModuleType("ti_test_raising_variant")

    class Raising:
        def __init__(self, config, **kw):
            raise RuntimeError("kernel not built")

    mod.Raising = Raising
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(dsv4_registry.VARIANTS, "v_raise", Variant("v_raise", "v0", f"{mod.__name__}:Raising", "x", "experimental"))
    assert main(["validate-model-variants", "--family", "dsv4", "--variant", "v_raise"]) == 1
    assert "RuntimeError: kernel not built" in capsys.readouterr().out


def test_bad_flags_are_one_line_errors(capsys):
    for argv, needle in ((["--family", "dsv4", "--variant", "v9"], "unknown variant 'v9' for family dsv4 (valid: pipeline-v0, tp-v0, v0, v1)"),
                         (["--variant", "v0", "--family", "llama3"], "is the reference (v0) itself"),
                         (["--family", "nope"], "unknown model family 'nope'"),
                         (["--rtol", "0"], "--rtol must be positive")):
        assert main(["validate-model-variants", *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_model_variants_lists_dsv4(capsys):
    assert main(["model-variants", "--family", "dsv4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["variant"], r["parent"]) for r in rows] == [("v0", None), ("v1", "v0"), ("tp-v0", "v0"),
                                                          ("pipeline-v0", "v0")]


@pytest.mark.parametrize("family,pkg", [("dsv4", "dsv4"), ("deepseek-v3.2", "deepseek_v32")])
def test_promoted_variants_are_validated(family, pkg, tmp_path, capsys):
    """A promoted record (v1's class + an ops-module override) is built by family.build and compared with v0."""
    from torchinferno.models.registry import get_family

    cls_path = __import__(f"torchinferno.models.{pkg}.registry", fromlist=["VARIANTS"]).VARIANTS["v1"].class_path
    reg = tmp_path / "promoted.json"
    reg.write_text(json.dumps({"version": 1, "families": {get_family(family).name: {"v1-cop": {
        "name": "v1-cop", "parent": "v1", "fallback": "v1", "status": "promoted", "class_path": cls_path,
        "ops_module": f"torchinferno.models.{pkg}.custom_ops_ops", "notes": "test"}}}}))
    assert main(["validate-model-variants", "--family", family, "--variant", "v1-cop", "--registry", str(reg)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "v1-cop" in ln)
    assert "PASS" in line and "promoted" in line
