"""DeepSeek checkpoint audit (headers only) and convert (FP8 dequantized, sharded, report) for the
deepseek-v3.2 and dsv4 targets; dsv4 refuses what it cannot represent, naming the tensor/key."""

import json
from dataclasses import replace

import pytest
import torch

from torchinferno.checkpoint import safetensors_io
from torchinferno.checkpoint.auto import load_model_auto
from torchinferno.checkpoint.deepseek_convert import REPORT_FILE, audit_checkpoint, convert_checkpoint
from torchinferno.checkpoint.fp8 import quantize_fp8_block
from torchinferno.cli.variants_cmds import randomize
from torchinferno.errors import CheckpointError, ConfigError
from torchinferno.models.common.rope import RopeScaling
from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
from torchinferno.models.registry import get_family

DS = get_family("deepseek-v3.2")
IDS = torch.randint(0, 320, (11,), generator=torch.Generator().manual_seed(5))


def _logits(m):
    with torch.no_grad():
        return m.compute_logits(m(IDS, torch.arange(len(IDS))))


def _deepseek_ckpt(d, cfg, fp8=False, mtp=False, max_shard_bytes=2**30):
    m = randomize(DS.build(cfg, device="cpu", variant="v0")).eval()
    m.family = DS
    tensors = {}
    for name, t in DS.export_weights(m):
        if fp8 and t.dim() == 2 and "norm" not in name and "embed" not in name and "lm_head" not in name \
                and not name.endswith("mlp.gate.weight"):
            tensors[name], tensors[name + "_scale_inv"] = quantize_fp8_block(t)
        else:
            tensors[name] = t.clone()
    hf = DS.config_to_hf(cfg)
    if fp8:
        hf["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    if mtp:  # one multi-token-prediction layer stored after the last layer, as the public release does
        L = cfg.num_hidden_layers
        hf["num_nextn_predict_layers"] = 1
        q, s = quantize_fp8_block(torch.randn(64, 128))
        tensors.update({f"model.layers.{L}.eh_proj.weight": q, f"model.layers.{L}.eh_proj.weight_scale_inv": s,
                        f"model.layers.{L}.enorm.weight": torch.ones(64)})
    safetensors_io.save_hf_dir(d, hf, tensors, max_shard_bytes=max_shard_bytes)
    (d / "tokenizer.json").write_text("{}")
    return m, tensors


@pytest.fixture(scope="module")
def fp8_v32(tmp_path_factory):
    d = tmp_path_factory.mktemp("v32_fp8")
    _deepseek_ckpt(d, replace(tiny_deepseek_v32_config(), num_hidden_layers=2), fp8=True, mtp=True, max_shard_bytes=60_000)
    return d


def test_deepseek_audit_reads_headers_and_skips_mtp(fp8_v32, monkeypatch):
    def no_tensor_reads(*a, **k):
        raise AssertionError("audit must not read tensor data")

    monkeypatch.setattr(safetensors_io, "iter_tensors", no_tensor_reads)
    rep = audit_checkpoint(fp8_v32, "deepseek-v3.2")
    assert rep.ok, rep.first_problem()
    assert rep.matched == rep.expected and rep.fp8_weights == rep.fp8_scales > 10
    assert {r["name"] for r in rep.skipped} == {"model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight"}


def test_deepseek_convert_dequantizes_and_writes_report(fp8_v32, tmp_path):
    rep = convert_checkpoint(fp8_v32, tmp_path / "f32", "deepseek-v3.2", dtype="float32", max_shard_bytes=100_000)
    assert len(rep["shards"]) > 1 and (tmp_path / "f32" / "model.safetensors.index.json").is_file()
    assert rep["dequantized_fp8"] == audit_checkpoint(fp8_v32, "deepseek-v3.2").fp8_weights - 1  # minus the MTP one
    assert [r["name"] for r in rep["dropped"]][0].startswith("model.layers.2.")
    on_disk = json.loads((tmp_path / "f32" / REPORT_FILE).read_text())
    assert on_disk["target_family"] == "deepseek-v3.2" and on_disk["audit"]["ok"]
    assert (tmp_path / "f32" / "tokenizer.json").is_file()
    index = safetensors_io.tensor_index(tmp_path / "f32")
    assert not any(n.endswith("_scale_inv") or n.startswith("model.layers.2.") for n in index)
    assert {i.dtype for i in index.values()} == {"F32"}
    cfg = json.loads((tmp_path / "f32" / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 0 and "quantization_config" not in cfg
    # converted (fp32) == loading the FP8 checkpoint directly (dequantized at load): exact
    torch.testing.assert_close(_logits(load_model_auto(tmp_path / "f32", variant="v0")),
                               _logits(load_model_auto(fp8_v32, variant="v0")), atol=0, rtol=0)
    auto = convert_checkpoint(fp8_v32, tmp_path / "auto", "deepseek-v3.2")  # FP8 -> bf16, the rest kept
    assert auto["dtypes_written"].keys() == {"bfloat16", "float32"}


def test_dsv4_convert_from_deepseek_v3_matches_deepseek_logits(tmp_path):
    cfg = replace(tiny_deepseek_v32_config(), index_n_heads=0, n_group=1, topk_group=1, rope_scaling=RopeScaling())
    src = tmp_path / "v3"
    m, tensors = _deepseek_ckpt(src, cfg)
    assert tensors["model.layers.1.mlp.gate.e_score_correction_bias"].abs().sum() > 0  # selection bias exercised
    assert audit_checkpoint(src, "dsv4").ok
    rep = convert_checkpoint(src, tmp_path / "dsv4", "dsv4")
    assert rep["output_model_type"] == "torchinferno_dsv4"
    got = load_model_auto(tmp_path / "dsv4", variant="v0")
    assert got.family.name == "dsv4" and got.config.rope_interleave
    torch.testing.assert_close(_logits(got), _logits(m), atol=1e-5, rtol=1e-5)


def test_dsv4_refuses_indexer_and_mtp_naming_them(fp8_v32, tmp_path):
    src = tmp_path / "v32"
    _deepseek_ckpt(src, replace(tiny_deepseek_v32_config(), num_hidden_layers=2, n_group=1, topk_group=1,
                                rope_scaling=RopeScaling()), mtp=True)
    rep = audit_checkpoint(src, "dsv4")
    refused = {r["name"] for r in rep.refused}
    assert not rep.ok and "model.layers.0.self_attn.indexer.wq_b.weight" in refused and "model.layers.2.eh_proj.weight" in refused
    with pytest.raises(CheckpointError, match=r"cannot convert .* to dsv4: 'model\.layers\.\d\.self_attn\.indexer\.\S+' "
                                              r"cannot be represented by dsv4 \(.*indexer.*\) \(\+\d+ more"):
        convert_checkpoint(src, tmp_path / "out", "dsv4")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="'n_group'=4 / 'topk_group'=2: group-limited routing cannot be represented"):
        audit_checkpoint(fp8_v32, "dsv4")
    hf = {**DS.config_to_hf(tiny_deepseek_v32_config()), "n_group": 1, "topk_group": 1}
    with pytest.raises(ConfigError, match="'rope_parameters': rope_type 'yarn' cannot be represented by dsv4"):
        get_family("dsv4").extra["config_from_deepseek_hf"](hf)


def test_audit_reports_mismatch_missing_unexpected(tmp_path):
    src = tmp_path / "v3"
    cfg = replace(tiny_deepseek_v32_config(), index_n_heads=0, num_hidden_layers=2)
    _, tensors = _deepseek_ckpt(src, cfg)
    bad = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.experts.4.down_proj.weight"}
    bad["model.layers.0.self_attn.kv_b_proj.weight"] = torch.zeros(7, 7)
    bad["model.layers.0.self_attn.mystery.weight"] = torch.zeros(2)
    safetensors_io.save_hf_dir(tmp_path / "bad", json.loads((src / "config.json").read_text()), bad)
    rep = audit_checkpoint(tmp_path / "bad", "deepseek-v3.2")
    assert rep.missing == ["model.layers.1.mlp.experts.4.down_proj.weight"]
    assert rep.mismatched == [{"name": "model.layers.0.self_attn.kv_b_proj.weight", "checkpoint": [7, 7], "expected": [128, 32]}]
    assert [r["name"] for r in rep.unexpected] == ["model.layers.0.self_attn.mystery.weight"]
    with pytest.raises(CheckpointError, match=r"shape mismatch for tensor 'model\.layers\.0\.self_attn\.kv_b_proj\.weight'"):
        convert_checkpoint(tmp_path / "bad", tmp_path / "out", "deepseek-v3.2")
    cfg_json = json.loads((src / "config.json").read_text())
    safetensors_io.save_hf_dir(tmp_path / "mt", {**cfg_json, "model_type": "llama"}, tensors)
    with pytest.raises(ConfigError, match="'model_type' is 'llama'"):
        audit_checkpoint(tmp_path / "mt", "deepseek-v3.2")
    with pytest.raises(ConfigError, match="'model_type' is 'llama'"):
        audit_checkpoint(tmp_path / "mt", "dsv4")
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        audit_checkpoint(tmp_path / "nope", "dsv4")
