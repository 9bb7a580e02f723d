"""deepseek-v4-smoke / -hf-smoke / -audit / -convert."""

import json

import torch
from safetensors.torch import load_file, save_file

from torchinferno.checkpoint.auto import load_model_auto
from torchinferno.cli.main import main
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.model import (
    DeepSeekV4ForCausalLM,
    randomize_untrained_,
)


def test_smoke_passes_against_full_forward_and_transformers(capsys):
    assert main(["deepseek-v4-smoke", "--prompt-tokens", "14", "--new-tokens", "11"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v4-smoke PASS" in out and "vs transformers max_abs_err" in out


def test_hf_smoke_audit_and_convert(tmp_path, capsys):
    torch.manual_seed(0)
    m = randomize_untrained_(DeepSeekV4ForCausalLM(tiny_deepseek_v4_config()).eval(), seed=5)
    m.save_pretrained(tmp_path / "ckpt")
    assert main(["deepseek-v4-hf-smoke", str(tmp_path / "ckpt"), "--cache-backend", "dense", "--no-transformers"]) == 0
    assert "deepseek-v4-hf-smoke PASS" in capsys.readouterr().out
    assert main(["deepseek-v4-audit", str(tmp_path / "ckpt")]) == 0
    assert "deepseek-v4-audit OK" in capsys.readouterr().out
    assert main(["deepseek-v4-convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--dtype", "float32"]) == 0
    assert "deepseek-v4-convert OK" in capsys.readouterr().out
    back = load_model_auto(tmp_path / "out")
    for (a, x), (b, y) in zip(m.state_dict().items(), back.state_dict().items()):
        assert a == b and torch.equal(x, y), a
    # an unknown tensor and a missing one are named by the audit
    shard = next((tmp_path / "ckpt").glob("*.safetensors"))
    sd = load_file(str(shard))
    sd["model.layers.0.self_attn.mystery.weight"] = torch.zeros(2)
    sd.pop("model.layers.2.self_attn.compressor.position_bias")
    sd["model.layers.1.self_attn.sinks"] = torch.zeros(5)
    save_file(sd, str(shard))
    assert main(["deepseek-v4-audit", str(tmp_path / "ckpt"), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["unknown"] == ["model.layers.0.self_attn.mystery.weight"]
    assert rep["missing"] == ["model.layers.2.self_attn.compressor.position_bias"]
    assert rep["bad_shape"] == ["model.layers.1.self_attn.sinks (5,) (expects (4,))"]
