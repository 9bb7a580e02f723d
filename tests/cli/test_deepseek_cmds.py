"""Bring-up commands: smokes (tiny and from a checkpoint), audit/convert, text-generate,
capture-logits / validate-logits; failures exit non-zero with one line naming the problem."""

import json
from dataclasses import replace

import pytest
import torch

from torchinferno.checkpoint import safetensors_io
from torchinferno.checkpoint.auto import save_pretrained
from torchinferno.cli.main import main
from torchinferno.cli.variants_cmds import randomize
from torchinferno.models.common.rope import RopeScaling
from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
from torchinferno.models.dsv4 import fused_ops
from torchinferno.models.registry import get_family


def _one_line_error(capsys, *needles):
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    for n in needles:
        assert n in err[0], err[0]


@pytest.fixture(scope="module")
def dsv4_dir(tmp_path_factory):
    fam = get_family("dsv4")
    m = randomize(fam.build(fam.size("debug"), device="cpu", variant="v0"))
    m.family = fam
    d = tmp_path_factory.mktemp("dsv4_ckpt")
    save_pretrained(m, d)
    return d


@pytest.mark.parametrize("argv", [
    ["dsv4-smoke"],
    ["dsv4-smoke", "--cache-backend", "dense", "--no-q-lora", "--score-bias", "--batch-size", "3"],
    ["deepseek-smoke", "--no-q-lora", "--score-bias", "--cache-backend", "dense", "--new-tokens", "4"],
    ["deepseek-smoke", "--prompt-tokens", "14", "--new-tokens", "3"],  # indexer top-8 < 14: sparse selection
])
def test_smokes_pass(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and " PASS: max_abs_err=" in out and "greedy tokens match" in out


def test_smoke_fails_when_cached_decode_is_wrong(monkeypatch, capsys):
    real = fused_ops.latent_absorbed_attention
    monkeypatch.setattr(fused_ops, "latent_absorbed_attention", lambda *a, **k: real(*a, **k) * 1.05)
    assert main(["dsv4-smoke", "--new-tokens", "3"]) == 1
    assert "dsv4-smoke FAIL" in capsys.readouterr().out


def test_hf_smokes_and_family_check(dsv4_dir, capsys):
    assert main(["dsv4-hf-smoke", str(dsv4_dir), "--cache-backend", "paged", "--new-tokens", "3"]) == 0
    assert "dsv4-hf-smoke PASS" in capsys.readouterr().out
    assert main(["deepseek-hf-smoke", str(dsv4_dir)]) == 1
    _one_line_error(capsys, "torchinferno_dsv4", "deepseek-hf-smoke expects deepseek_v3")
    assert main(["dsv4-smoke", "--prompt-tokens", "600"]) == 1
    _one_line_error(capsys, "max_position_embeddings=512")


def test_text_generate_alias(dsv4_dir, capsys):
    assert main(["text-generate", str(dsv4_dir), "hi", "--tokenizer", "byte", "--max-new-tokens", "4",
                 "--ignore-eos", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_token_ids"][-2:] == [104, 105] and len(out["token_ids"]) == 4


def test_capture_and_validate_logits(dsv4_dir, tmp_path, capsys):
    ref = tmp_path / "ref.json"
    assert main(["capture-logits", str(dsv4_dir), str(ref), "--input-ids", "1", "2", "3", "250"]) == 0
    data = json.loads(ref.read_text())
    assert data["input_ids"] == [1, 2, 3, 250] and len(data["logits"]) == 4 and len(data["logits"][0]) == 320
    assert data["model_type"] == "torchinferno_dsv4"
    capsys.readouterr()
    assert main(["validate-logits", str(dsv4_dir), str(ref), "--variant", "v0", "--json-output", str(tmp_path / "r.json")]) == 0
    assert "validate-logits PASS" in capsys.readouterr().out and json.loads((tmp_path / "r.json").read_text())["ok"]
    data["logits"][2][17] += 0.01
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["validate-logits", str(dsv4_dir), str(bad)]) == 1
    assert "validate-logits FAIL" in (out := capsys.readouterr().out) and "position 2 token 17" in out
    bad.write_text(json.dumps({"input_ids": [1]}))
    assert main(["validate-logits", str(dsv4_dir), str(bad)]) == 1
    _one_line_error(capsys, "missing key 'logits'")
    assert main(["capture-logits", str(dsv4_dir), str(ref), "--input-ids", "1", "999"]) == 1
    _one_line_error(capsys, "input id 999", "0..319")


@pytest.fixture(scope="module")
def v32_dir(tmp_path_factory):
    """A tiny V3.2 checkpoint dsv4 can read the config of (default rope, no groups) but not the indexer."""
    fam = get_family("deepseek-v3.2")
    cfg = replace(tiny_deepseek_v32_config(), num_hidden_layers=2, n_group=1, topk_group=1, rope_scaling=RopeScaling())
    m = randomize(fam.build(cfg, device="cpu", variant="v0"))
    m.family = fam
    d = tmp_path_factory.mktemp("v32")
    save_pretrained(m, d)
    return d


def test_audit_and_convert_commands(v32_dir, tmp_path, capsys):
    assert main(["deepseek-audit", str(v32_dir)]) == 0
    assert capsys.readouterr().out.startswith("deepseek-v3.2-audit OK:")
    assert main(["deepseek-convert", str(v32_dir), str(tmp_path / "out"), "--dtype", "bfloat16", "--max-shard-size", "50KB"]) == 0
    assert "deepseek-v3.2-convert OK" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "torchinferno_conversion_report.json").read_text())
    assert len(report["shards"]) > 1 and report["dtypes_written"] == {"bfloat16": report["tensors_written"]}
    assert main(["deepseek-hf-smoke", str(tmp_path / "out"), "--dtype", "bfloat16", "--new-tokens", "3"]) == 0
    assert "deepseek-hf-smoke PASS" in capsys.readouterr().out

    assert main(["dsv4-audit", str(v32_dir), "--json-output", str(tmp_path / "audit.json")]) == 1
    out = capsys.readouterr().out
    assert "dsv4-audit FAIL" in out and "refused: model.layers.0.self_attn.indexer.wq_b.weight" in out
    assert not json.loads((tmp_path / "audit.json").read_text())["ok"]
    assert main(["dsv4-convert", str(v32_dir), str(tmp_path / "dsv4")]) == 1
    _one_line_error(capsys, "cannot be represented by dsv4", "self_attn.indexer.")
    assert not (tmp_path / "dsv4").exists()
    assert main(["dsv4-convert", str(v32_dir), str(tmp_path / "x"), "--max-shard-size", "lots"]) == 1
    _one_line_error(capsys, "invalid size 'lots'")


def test_convert_refuses_wrong_shape_naming_tensor(v32_dir, tmp_path, capsys):
    tensors = dict(safetensors_io.iter_tensors(v32_dir))
    tensors["model.layers.1.mlp.experts.2.up_proj.weight"] = torch.zeros(5, 64)
    safetensors_io.save_hf_dir(tmp_path / "bad", json.loads((v32_dir / "config.json").read_text()), tensors)
    assert main(["deepseek-audit", str(tmp_path / "bad")]) == 1
    assert "mismatched: model.layers.1.mlp.experts.2.up_proj.weight: checkpoint (5, 64), expected (32, 64)" in capsys.readouterr().out
    assert main(["deepseek-convert", str(tmp_path / "bad"), str(tmp_path / "out")]) == 1
    _one_line_error(capsys, "shape mismatch for tensor 'model.layers.1.mlp.experts.2.up_proj.weight'")
