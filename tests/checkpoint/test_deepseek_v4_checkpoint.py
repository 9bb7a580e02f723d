"""deepseek-v4 checkpoints: our save_pretrained <-> transformers, transformers' save names and the public release
spelling load, FP8 / MXFP4 weights dequantize on load, and a bad tensor names itself."""

import json

import pytest
import torch
from safetensors.torch import save_file

from torchinferno.checkpoint.auto import load_model_auto
from torchinferno.checkpoint.quant_v4 import dequantize_mxfp4, quantize_mxfp4
from torchinferno.errors import CheckpointError
from torchinferno.models.deepseek_v4.config import config_to_hf, tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.model import (
    DeepSeekV4ForCausalLM,
    randomize_untrained_,
)

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([5, 17, 250, 9, 41, 77, 5, 130, 12, 200, 8, 3, 99])


def logits(m):
    with torch.no_grad():
        return m.compute_logits(m(IDS, torch.arange(len(IDS))))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_untrained_(DeepSeekV4ForCausalLM(tiny_deepseek_v4_config()).eval(), seed=3)


def hf_from(model):
    d = config_to_hf(model.config)
    d.pop("architectures")
    hc = transformers.DeepseekV4Config(**d)
    hm = transformers.DeepseekV4ForCausalLM(hc).eval()
    hm.load_state_dict(model.state_dict(), strict=False)
    return hm


def write(dirpath, tensors: dict, config: dict):
    dirpath.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dirpath / "model.safetensors"))
    (dirpath / "config.json").write_text(json.dumps(config))
    return dirpath


def test_save_pretrained_round_trip_and_transformers_reads_it(model, tmp_path):
    model.save_pretrained(tmp_path / "ours")
    back = DeepSeekV4ForCausalLM.from_pretrained(tmp_path / "ours")
    auto = load_model_auto(tmp_path / "ours")
    assert auto.family.name == "deepseek-v4"
    ref = logits(model)
    assert torch.equal(logits(back), ref) and torch.equal(logits(auto), ref)
    hm = transformers.DeepseekV4ForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    with torch.no_grad():
        assert (hm(IDS[None], use_cache=False).logits[0] - ref).abs().max() < 1e-5


def test_transformers_save_pretrained_names_load(model, tmp_path):
    hf_from(model).save_pretrained(tmp_path / "hf")  # writes the release spelling (attn.wq_a, ffn.experts.N.w1, ...)
    loaded = load_model_auto(tmp_path / "hf")
    assert (logits(loaded) - logits(model)).abs().max() < 1e-6


def release_names(model) -> dict:
    """The public release spelling: no ``model.`` prefix, ``embed``/``head``, per-expert w1/w2/w3, ``mtp.*`` extra."""
    out = {}
    for name, t in model.state_dict().items():
        n = name.removeprefix("model.")
        n = n.replace("embed_tokens.weight", "embed.weight").replace("lm_head.weight", "head.weight")
        n = n.replace("hc_head.hc_", "hc_head_").replace(".self_attn.", ".attn.").replace(".mlp.", ".ffn.")
        n = n.replace(".input_layernorm.", ".attn_norm.").replace(".post_attention_layernorm.", ".ffn_norm.")
        n = n.replace(".attn_hc.", ".hc_attn_").replace(".ffn_hc.", ".hc_ffn_").replace(".sinks", ".attn_sink")
        n = n.replace(".compressor.indexer.scorer.weights_proj.", ".indexer.weights_proj.")
        n = n.replace(".compressor.indexer.q_b_proj.", ".indexer.wq_b.").replace(".compressor.indexer.", ".indexer.compressor.")
        n = n.replace(".kv_norm.", ".norm.").replace(".position_bias", ".ape").replace(".q_a_proj.", ".wq_a.")
        n = n.replace(".attn.q_b_proj.", ".attn.wq_b.").replace(".kv_proj.", ".wkv.").replace(".gate_proj.", ".wgate.")
        n = n.replace(".o_a_proj.", ".wo_a.").replace(".o_b_proj.", ".wo_b.").replace(".q_a_norm.", ".q_norm.")
        n = n.replace(".gate.e_score_correction_bias", ".gate.bias")
        n = n.replace(".shared_experts.wgate.", ".shared_experts.w1.").replace(".shared_experts.down_proj.", ".shared_experts.w2.")
        n = n.replace(".shared_experts.up_proj.", ".shared_experts.w3.")
        if n.endswith("experts.gate_up_proj"):
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[n.replace("gate_up_proj", f"{e}.w1.weight")] = t[e, :inter]
                out[n.replace("gate_up_proj", f"{e}.w3.weight")] = t[e, inter:]
        elif n.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                out[n.replace("down_proj", f"{e}.w2.weight")] = t[e]
        else:
            out[n] = t
    out["mtp.0.emb.weight"] = torch.zeros(2, 2)  # ignored
    return out


def test_release_spelling_loads(model, tmp_path):
    d = write(tmp_path / "rel", release_names(model), config_to_hf(model.config))
    assert (logits(load_model_auto(d)) - logits(model)).abs().max() < 1e-6


def fp8_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128 blocks, power-of-two (ue8m0) scales: -> (e4m3 weight, uint8 exponent scales)."""
    n, k = w.shape
    bn, bk = -(-n // 128), -(-k // 128)
    pad = torch.zeros(bn * 128, bk * 128)
    pad[:n, :k] = w
    amax = pad.view(bn, 128, bk, 128).abs().amax(dim=(1, 3)).clamp(min=1e-12)
    e = torch.ceil(torch.log2(amax / 448.0))
    s = torch.exp2(e).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return (w / s).to(torch.float8_e4m3fn), (e + 127).to(torch.uint8)


def test_fp8_and_mxfp4_release_weights_dequantize_on_load(model, tmp_path):
    tensors = release_names(model)
    expect = {}
    for name in list(tensors):
        t = tensors[name]
        if name.endswith(("wq_a.weight", "wo_b.weight")) and "layers.1." in name:
            q, s = fp8_quantize(t)
            tensors[name], tensors[name[: -len("weight")] + "scale"] = q, s
            expect[name] = q.float() * torch.exp2(s.float() - 127).repeat_interleave(128, 0)[: t.shape[0]].repeat_interleave(128, 1)[:, : t.shape[1]]
        elif ".experts.0.w" in name and "layers.2." in name:
            q, s = quantize_mxfp4(t)
            tensors[name], tensors[name[: -len("weight")] + "scale"] = q, s
            expect[name] = dequantize_mxfp4(q, s, name)
    d = write(tmp_path / "q", tensors, config_to_hf(model.config))
    loaded = load_model_auto(d)
    sd = loaded.state_dict()
    a = sd["model.layers.1.self_attn.q_a_proj.weight"]
    assert torch.equal(a, expect["layers.1.attn.wq_a.weight"])
    assert (a - model.state_dict()["model.layers.1.self_attn.q_a_proj.weight"]).abs().max() < 0.02  # really quantized
    assert torch.equal(sd["model.layers.2.mlp.experts.down_proj"][0], expect["layers.2.ffn.experts.0.w2.weight"])
    # a scale of the wrong shape names its tensor
    bad = dict(tensors)
    bad["layers.1.attn.wq_a.scale"] = torch.zeros(3, 3, dtype=torch.uint8)
    with pytest.raises(CheckpointError, match="layers.1.attn.wq_a"):
        load_model_auto(write(tmp_path / "bad", bad, config_to_hf(model.config)))


def test_bad_checkpoint_names_the_tensor(model, tmp_path):
    sd = {k: v for k, v in model.state_dict().items()}
    sd["model.layers.0.self_attn.kv_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.kv_proj\.weight"):
        load_model_auto(write(tmp_path / "shape", sd, config_to_hf(model.config)))
    sd = {k: v for k, v in model.state_dict().items() if "layers.3.mlp.experts.down_proj" not in k}
    with pytest.raises(CheckpointError, match="layers.3.mlp.experts.down_proj"):
        load_model_auto(write(tmp_path / "missing", sd, config_to_hf(model.config)))


def test_convert_release_streams_to_a_layout_both_load(model, tmp_path):
    from torchinferno.checkpoint.deepseek_v4_convert import convert_release

    tensors = release_names(model)
    for name in [n for n in tensors if "layers.3.ffn.experts.1.w" in n or n == "layers.0.attn.wkv.weight"]:
        t = tensors[name]
        q, s = quantize_mxfp4(t) if ".experts." in name else fp8_quantize(t)
        tensors[name], tensors[name[: -len("weight")] + "scale"] = q, s
    src = write(tmp_path / "rel", tensors, config_to_hf(model.config))
    direct = load_model_auto(src)  # the loader dequantizes the same way
    rep = convert_release(src, tmp_path / "conv", dtype=torch.float32, max_shard_bytes=200_000)
    assert rep["dequantized"] == 4 and rep["dropped"] == ["mtp.0.emb.weight"]
    assert len(list((tmp_path / "conv").glob("model-*.safetensors"))) > 1  # sharded
    conv = load_model_auto(tmp_path / "conv")
    for (a, x), (b, y) in zip(direct.state_dict().items(), conv.state_dict().items()):
        assert a == b and torch.equal(x, y), a
    hm = transformers.DeepseekV4ForCausalLM.from_pretrained(tmp_path / "conv", attn_implementation="eager").eval()
    with torch.no_grad():
        assert (hm(IDS[None], use_cache=False).logits[0] - logits(conv)).abs().max() < 1e-5
    bad = dict(tensors)
    bad["layers.3.ffn.experts.9.w1.weight"] = torch.zeros(2, 2)
    with pytest.raises(CheckpointError, match=r"layers\.3\.ffn\.experts\.9\.w1\.weight"):
        convert_release(write(tmp_path / "bad", bad, config_to_hf(model.config)), tmp_path / "conv2")


def test_mxfp4_layout_low_nibble_first_and_ue8m0_scales():
    packed = torch.tensor([[0x21] + [0x00] * 15, [0xF9] + [0x77] * 15], dtype=torch.uint8)  # [2, 16] -> 32 values
    scale = torch.tensor([[128], [125]], dtype=torch.uint8)  # 2^1, 2^-2
    w = dequantize_mxfp4(packed, scale, "w")
    assert w[0, :2].tolist() == [1.0, 2.0] and w[0, 2:].abs().sum() == 0  # 0x21: low 1 -> 0.5, high 2 -> 1.0; x2
    assert w[1, :2].tolist() == [-0.125, -1.5] and w[1, 2:4].tolist() == [1.5, 1.5]  # 0x9 -> -0.5, 0xF -> -6; x1/4
    with pytest.raises(CheckpointError, match="'w'"):
        dequantize_mxfp4(packed, scale[:, :0], "w")


def test_bf16_load_equals_transformers_bf16(model, tmp_path):
    """bf16: same fp32-kept tensors, rope tables rounded to bf16 and an fp32 sink softmax, as transformers does."""
    model.save_pretrained(tmp_path / "ours")
    ours = load_model_auto(tmp_path / "ours", dtype="bfloat16")
    hm = transformers.DeepseekV4ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.bfloat16,
                                                            attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hm(IDS[None], use_cache=False).logits[0].float()
    assert torch.equal(logits(ours), ref)
