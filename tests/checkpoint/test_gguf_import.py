"""convert_gguf on tiny llama GGUFs: weights, config and tokenizer against transformers' GGUF loader."""

from __future__ import annotations

import json

import pytest
import torch
from ckpt_fixtures import HEADS, KV_HEADS, SAMPLE_TEXTS, llama_cpp_permute, write_tiny_gguf

from torchinferno.checkpoint import convert_gguf, iter_tensors, read_config, tensor_index
from torchinferno.errors import CheckpointError


@pytest.fixture(scope="module")
def hf_gguf_model(tiny_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_gguf.path.parent), gguf_file=tiny_gguf.path.name)


@pytest.fixture(scope="module")
def hf_gguf_tokenizer(tiny_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_gguf.path.parent), gguf_file=tiny_gguf.path.name)


def test_tensors_equal_transformers_gguf_loader(tiny_gguf_converted, hf_gguf_model):
    ours = dict(iter_tensors(tiny_gguf_converted))
    ref = hf_gguf_model.state_dict()
    assert set(ours) == set(ref)
    for name, t in ours.items():
        assert t.dtype == torch.float32 and torch.equal(t, ref[name]), name


def test_qk_rows_unpermuted_to_hf_layout(tiny_gguf, tiny_gguf_converted):
    ours = dict(iter_tensors(tiny_gguf_converted))
    for proj, heads in (("q_proj", HEADS), ("k_proj", KV_HEADS)):
        name = f"model.layers.1.self_attn.{proj}.weight"
        orig = tiny_gguf.hf[name]
        err = (ours[name] - orig).abs().max().item()
        still_permuted = torch.from_numpy(llama_cpp_permute(orig.numpy(), heads))
        assert err < 0.03, (name, err)  # only Q4_1 rounding error left
        assert (ours[name] - still_permuted).abs().max().item() > 0.1  # the permutation really was undone
    for name, orig in tiny_gguf.hf.items():  # every tensor lands under the right HF name
        assert (ours[name] - orig).abs().max().item() < 0.03, name


def test_config_and_side_files(tiny_gguf, tiny_gguf_converted):
    cfg = read_config(tiny_gguf_converted)
    expect = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 256,
        "vocab_size": len(tiny_gguf.tokens), "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 2, "torch_dtype": "float32",
    }
    assert {k: cfg.get(k) for k in expect} == expect
    gen = json.loads((tiny_gguf_converted / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1
    tcfg = json.loads((tiny_gguf_converted / "tokenizer_config.json").read_text())
    assert tcfg["bos_token"] == "<|im_start|>" and tcfg["eos_token"] == "<|im_end|>"
    assert tcfg["add_bos_token"] is True and "<|im_start|>" in tcfg["chat_template"]


def test_config_loads_in_transformers(tiny_gguf_converted, hf_gguf_model):
    from transformers import AutoConfig

    ours, ref = AutoConfig.from_pretrained(tiny_gguf_converted), hf_gguf_model.config
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "max_position_embeddings"):
        assert getattr(ours, k) == pytest.approx(getattr(ref, k), rel=1e-6), k  # eps: we round float32 1e-5


def test_tokenizer_matches_transformers_gguf_tokenizer(tiny_gguf_converted, hf_gguf_tokenizer):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ours = Tokenizer.from_file(str(tiny_gguf_converted / "tokenizer.json"))
    ours_hf = AutoTokenizer.from_pretrained(str(tiny_gguf_converted))
    for text in SAMPLE_TEXTS:
        ref = hf_gguf_tokenizer(text)["input_ids"]
        assert ours.encode(text).ids == ref, text
        assert ours_hf(text)["input_ids"] == ref, text
        assert ours.decode(ref, skip_special_tokens=False) == hf_gguf_tokenizer.decode(ref), text
    assert ours.encode("hi").ids[0] == 1  # add_bos_token from the GGUF metadata
    assert ours.token_to_id("<think>") == len(ours.get_vocab()) - 1  # user-defined token kept its id
    msgs = [{"role": "user", "content": "hello 42"}]
    assert ours_hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        hf_gguf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    )


def test_smollm_pre_isolates_digits(tiny_gguf_converted):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_gguf_converted / "tokenizer.json"))
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("x 2024")]
    assert pieces == ["x", "Ġ", "2", "0", "2", "4"]


def test_sentencepiece_tokenizer_matches_transformers(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    g = write_tiny_gguf(tmp_path / "spm.gguf", tokenizer="llama", pre="default", add_bos=None, tied=True)
    out = convert_gguf(g.path, tmp_path / "out", dtype=torch.bfloat16)
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in SAMPLE_TEXTS + ["<s>Hello</s>", " leading space", "The weather in Paris"]:
        ids = ref(text)["input_ids"]
        assert ours.encode(text).ids == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids), text
    assert ours.encode("x").ids[0] == 1  # sentencepiece vocabularies default to add_bos
    cfg = read_config(out)
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
    index = tensor_index(out)
    assert "lm_head.weight" not in index and index["model.embed_tokens.weight"].dtype == "BF16"


def test_llama3_rope_freqs_become_rope_scaling(tmp_path):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    hf_cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=1024,
                         rope_parameters=params)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    plain = 1.0 / 500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    divisors = (plain / scaled.double()).tolist()  # what llama.cpp stores in rope_freqs.weight
    assert 1.0 < sorted(divisors)[3] < 8.0  # the smooth band is exercised
    g = write_tiny_gguf(tmp_path / "r.gguf", rope_freqs=divisors)
    cfg = read_config(convert_gguf(g.path, tmp_path / "out"))
    rs = cfg["rope_scaling"]
    assert rs["rope_type"] == "llama3" and rs["original_max_position_embeddings"] == 64
    assert rs["factor"] == pytest.approx(8.0) and (rs["low_freq_factor"], rs["high_freq_factor"]) == (1.0, 4.0)
    assert "rope_freqs.weight" not in tensor_index(tmp_path / "out")


def test_unsupported_architecture(tmp_path):
    g = write_tiny_gguf(tmp_path / "g.gguf", arch="gemma")
    with pytest.raises(CheckpointError) as e:
        convert_gguf(g.path, tmp_path / "out")
    assert str(e.value) == f"unsupported GGUF architecture 'gemma' in {g.path} (supported: llama)"
    assert not (tmp_path / "out").exists()


def test_missing_tensor_and_corrupt_file(tmp_path):
    g = write_tiny_gguf(tmp_path / "m.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(CheckpointError, match=r"m\.gguf lacks tensor 'blk\.1\.ffn_up\.weight'"):
        convert_gguf(g.path, tmp_path / "out")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 100)
    with pytest.raises(CheckpointError, match=r"cannot read GGUF file .*bad\.gguf"):
        convert_gguf(bad, tmp_path / "out2")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(g.path.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"cannot read GGUF file .*cut\.gguf \(truncated"):
        convert_gguf(cut, tmp_path / "out4")
    with pytest.raises(CheckpointError, match="GGUF file not found"):
        convert_gguf(tmp_path / "nope.gguf", tmp_path / "out3")


@pytest.mark.parametrize("head_dim,factor", [(128, 8.0), (64, 32.0)])  # Llama 3.1 8B / Llama 3.2 1B shapes
def test_llama3_rope_recovery_real_shapes(head_dim, factor):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from torchinferno.checkpoint.gguf_config import llama3_rope_from_freqs

    params = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    hf_cfg = LlamaConfig(hidden_size=head_dim * 8, num_attention_heads=8, head_dim=head_dim,
                         max_position_embeddings=131072, rope_parameters=params)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    plain = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    divisors = (plain / scaled.double()).float().tolist()  # llama.cpp stores float32
    got = llama3_rope_from_freqs(divisors, head_dim, 500000.0, "x.gguf")
    assert got["original_max_position_embeddings"] == 8192 and got["factor"] == pytest.approx(factor)
    with pytest.raises(CheckpointError, match="rope_freqs.weight"):
        llama3_rope_from_freqs([d * 1.1 for d in divisors], head_dim, 500000.0, "x.gguf")


def test_a_ggufs_recommended_sampling_becomes_the_serving_default(tmp_path):
    from torchinferno.checkpoint.gguf_config import generation_config
    from torchinferno.core.generation_defaults import load_sampling_defaults

    gen = generation_config({"tokenizer.ggml.eos_token_id": 2, "general.sampling.temp": 0.20000000298023224,
                             "general.sampling.top_p": 0.9, "general.sampling.top_k": 40,
                             "general.sampling.penalty_repeat": 1.1})
    assert {k: gen[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")} == {
        "temperature": 0.2, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1}
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    d = load_sampling_defaults("auto", tmp_path)
    assert d.values() == {"temperature": 0.2, "top_p": 0.9, "top_k": 40} and d.unsupported == ("repetition_penalty",)
    assert "temperature" not in generation_config({"tokenizer.ggml.eos_token_id": 2})  # none recommended: none set
