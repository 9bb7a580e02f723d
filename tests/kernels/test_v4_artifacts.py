"""Offline-prepared DeepSeek-V4 kernel artifacts (kernels/v4_artifacts.py), on CPU: the content-addressed key, the
manifest round trip, loading into a model (LLM(kernel_artifacts=...)), a missing / mismatching artifact ->
one notice line and the torch path, a bad directory -> one-line ConfigError, the CLI command."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.errors import ConfigError
from torchinferno.kernels import v4_artifacts as va
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.model import V4Attention, randomize_untrained_
from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

CFG = tiny_deepseek_v4_config()


def model():
    torch.manual_seed(0)
    return randomize_untrained_(DeepSeekV4V1(CFG).eval(), seed=1)


def attn_layers(m):
    return [x for x in m.modules() if isinstance(x, V4Attention)]


def test_key_depends_on_shapes_dtype_sources_and_versions():
    s = va.KernelShapes.of(CFG, torch.bfloat16)
    k = va.artifact_key(s)
    assert k == va.artifact_key(va.KernelShapes.of(CFG, torch.bfloat16)) and k.startswith("v4k-") and len(k) == 20
    others = {
        va.artifact_key(va.KernelShapes.of(replace(CFG, num_attention_heads=8, o_groups=2), torch.bfloat16)),
        va.artifact_key(va.KernelShapes.of(replace(CFG, index_topk=5), torch.bfloat16)),
        va.artifact_key(va.KernelShapes.of(CFG, torch.float16)),
        va.artifact_key(s, {**va.versions(), "triton": "0.0"}),
        va.artifact_key(s, digest="0" * 64),
    }
    assert k not in others and len(others) == 5
    # vocabulary / MoE sizes are not kernel shapes: the same artifact serves them
    assert va.artifact_key(va.KernelShapes.of(replace(CFG, vocab_size=400), torch.bfloat16)) == k


def test_prepare_manifest_round_trip_and_apply(tmp_path, capsys):
    out = va.prepare(CFG, tmp_path, torch.float32, tp_sizes=(1, 2), device="cpu", log=lambda s: None)
    assert out.parent == tmp_path and out.name == va.artifact_key(va.KernelShapes.of(CFG, torch.float32))
    man = json.loads((out / va.MANIFEST).read_text())
    assert man["key"] == out.name and man["tp_sizes"] == [1, 2] and not man["tuned"]
    assert set(man["configs"]) == {"H4-D32-float32", "H2-D32-float32"}
    assert va.prepare(CFG, tmp_path, torch.float32, tp_sizes=(1, 2), device="cpu", log=lambda s: None) == out
    for d in (tmp_path, out):  # the root or the artifact directory itself
        cfg, why = va.load(d, CFG, torch.float32, 4)
        assert cfg == man["configs"]["H4-D32-float32"]["config"] and why == ""
    m = model()
    assert va.apply(m, tmp_path)
    assert all(a.kernel_config == cfg and a.sparse_kernel for a in attn_layers(m))
    assert capsys.readouterr().err == ""


def _notice(m, d, capsys) -> str:
    assert not va.apply(m, d)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("notice: deepseek-v4 kernel artifacts not used"), err
    assert all(not a.sparse_kernel and a.kernel_config is None for a in attn_layers(m))
    return err[0]


def test_missing_and_mismatching_artifacts_fall_back_with_one_notice(tmp_path, capsys):
    assert "no artifact v4k-" in _notice(model(), tmp_path, capsys)  # an empty root
    out = va.prepare(CFG, tmp_path / "a", torch.float32, device="cpu", log=lambda s: None)
    man = json.loads((out / va.MANIFEST).read_text())
    (out / va.MANIFEST).write_text(json.dumps({**man, "key": "v4k-0000000000000000", "torch": "0.0"}))
    assert "torch 0.0 != " in _notice(model(), out, capsys)
    (out / va.MANIFEST).write_text(json.dumps(man))
    m16 = model().to(torch.bfloat16)  # prepared for float32 only
    assert "no artifact" in _notice(m16, tmp_path / "a", capsys)
    assert "other config shapes" in _notice(m16, out, capsys)
    out2 = va.prepare(CFG, tmp_path / "b", torch.float32, tp_sizes=(2,), device="cpu", log=lambda s: None)
    assert "has no H4-D32-float32" in _notice(model(), out2, capsys)


def test_bad_directory_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        va.apply(model(), tmp_path / "nope")
    (tmp_path / va.MANIFEST).write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable manifest"):
        va.apply(model(), tmp_path)
    with pytest.raises(ConfigError, match="deepseek-v4 models only"):
        va.apply(torch.nn.Linear(2, 2), tmp_path)


def test_llm_loads_artifacts_and_cli_prepares(tmp_path, capsys):
    from torchinferno.cli.main import main
    from torchinferno.engine.llm import LLM

    assert main(["prepare-deepseek-v4-kernels", "debug", str(tmp_path), "--device", "cpu", "--dtype", "float32",
                 "--tensor-parallel-sizes", "1,2"]) == 0
    assert "prepare-deepseek-v4-kernels OK: " in capsys.readouterr().out
    m = model()
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    want = LLM(model(), block_size=4).generate([[5, 6, 7, 8, 9]], p, use_tqdm=False)[0].token_ids
    got = LLM(m, block_size=4, kernel_artifacts=str(tmp_path)).generate([[5, 6, 7, 8, 9]], p, use_tqdm=False)
    assert got[0].token_ids == want and all(a.kernel_config is not None for a in attn_layers(m))
    assert main(["prepare-deepseek-v4-kernels", "debug", str(tmp_path), "--tensor-parallel-sizes", "3"]) == 1


def test_serve_spec_loads_or_falls_back(tmp_path, capsys):
    """``serve --kernel-artifacts DIR``: the flag reaches build_model through the ModelSpec."""
    import argparse

    from torchinferno.engine.assembly import build_model
    from torchinferno.server.args import add_server_args, model_spec_from_args

    p = argparse.ArgumentParser()
    add_server_args(p)
    spec = model_spec_from_args(p.parse_args(["--model-kind", "deepseek-v4", "--device", "cpu", "--dtype", "float32",
                                              "--kernel-artifacts", str(tmp_path)]))
    assert spec.kernel_artifacts == str(tmp_path)
    m = build_model(spec)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no artifact v4k-" in err[0], err
    assert not any(a.sparse_kernel for a in attn_layers(m))
    va.prepare(m.config, tmp_path, torch.float32, device="cpu", log=lambda s: None)
    assert all(a.kernel_config is not None for a in attn_layers(build_model(spec)))
