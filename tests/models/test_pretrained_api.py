"""The Hugging Face-style model API every family inherits (models/common/pretrained.py): the README's
Python snippets verbatim, direct construction, ``generate``, ``save_pretrained`` / ``from_pretrained``."""

import re
import textwrap

import pytest
import torch

import torchinferno
from torchinferno import DeepSeekV32ForCausalLM, DSv4ForCausalLM, Llama3ForCausalLM
from torchinferno.errors import ConfigError
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
from torchinferno.models.dsv4.config import tiny_dsv4_config
from torchinferno.models.llama3.config import debug_config

FAMILIES = {
    "llama3": (Llama3ForCausalLM, debug_config),
    "deepseek-v3.2": (DeepSeekV32ForCausalLM, tiny_deepseek_v32_config),
    "dsv4": (DSv4ForCausalLM, tiny_dsv4_config),
}


def _direct(name, seed=0, **overrides):
    cls, tiny = FAMILIES[name]
    torch.manual_seed(seed)
    return cls(tiny(vocab_size=128, max_seq_len=32, **overrides)).eval()


README_DSV4 = """
import torch

from torchinferno import DSv4ForCausalLM, tiny_dsv4_config

config = tiny_dsv4_config(vocab_size=128, max_seq_len=32)
model = DSv4ForCausalLM(config).eval()
prompt = torch.tensor([[1, 2, 3, 4]])

with torch.inference_mode():
    output = model.generate(prompt, max_new_tokens=4)

print(output)
"""

README_DEEPSEEK = """
import torch

from torchinferno import DeepSeekV32ForCausalLM, tiny_deepseek_v32_config

config = tiny_deepseek_v32_config(vocab_size=128, max_position_embeddings=32)
model = DeepSeekV32ForCausalLM(config).eval()
prompt = torch.tensor([[1, 2, 3, 4]])

with torch.inference_mode():
    output = model.generate(prompt, max_new_tokens=4)

print(output)
"""

README_70B = """
from torchinferno import llama3_70b_config

config = llama3_70b_config()
print(config.num_hidden_layers, config.hidden_size, config.num_attention_heads)
"""

README_CHECKPOINTS = """
model.save_pretrained("{out}")
loaded = DSv4ForCausalLM.from_pretrained("{out}")
"""


@pytest.mark.parametrize("snippet", [README_DSV4, README_DEEPSEEK], ids=["dsv4", "deepseek"])
def test_readme_model_snippets_run_verbatim(snippet, capsys):
    scope: dict = {}
    exec(compile(textwrap.dedent(snippet), "<README>", "exec"), scope)
    out = scope["output"]
    assert out.shape == (1, 8) and out.dtype == torch.long
    assert out[0, :4].tolist() == [1, 2, 3, 4] and int(out.max()) < 128
    printed = capsys.readouterr().out
    assert printed.startswith("tensor([[") and [int(t) for t in re.findall(r"\d+", printed)] == out[0].tolist()


def test_readme_70b_and_checkpoint_snippets(tmp_path, capsys):
    exec(README_70B, {})
    assert capsys.readouterr().out.split() == ["80", "8192", "64"]
    scope: dict = {}
    exec(README_DSV4, scope)
    exec(README_CHECKPOINTS.format(out=tmp_path / "tiny-dsv4"), scope)
    loaded, model = scope["loaded"], scope["model"]
    assert type(loaded) is DSv4ForCausalLM and loaded.family.name == "dsv4"
    prompt = scope["prompt"]
    assert torch.equal(loaded.generate(prompt, max_new_tokens=4), model.generate(prompt, max_new_tokens=4))


def test_top_level_exports():
    from torchinferno.engine.llm import LLM

    assert torchinferno.LLM is LLM
    assert "LLM" in torchinferno.__all__
    for name in torchinferno.__all__:
        assert getattr(torchinferno, name) is not None, name


@pytest.mark.parametrize("name", FAMILIES)
def test_direct_construction_is_a_usable_model(name):
    m = _direct(name)
    assert m.family.name == name  # from the class, via the registry: no loader involved
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in m.parameters())
    assert m.rope_cos.shape[0] == 32 and m.rope_cos.dtype == torch.float32
    ids = torch.tensor([1, 2, 3, 4, 5])
    with torch.no_grad():
        logits = m.compute_logits(m(ids, torch.arange(5)))
    assert logits.shape == (5, 128) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_rope_tables_stay_fp32_through_dtype_casts(name):
    m = _direct(name)
    want = m.rope_cos.clone()
    m.to(torch.bfloat16)
    assert m.model.embed_tokens.weight.dtype == torch.bfloat16
    assert m.rope_cos.dtype == torch.float32 and torch.equal(m.rope_cos, want)
    cls, tiny = FAMILIES[name]
    with torch.device("meta"):
        meta = cls(tiny(vocab_size=128, max_seq_len=32))
    meta.to_empty(device="cpu")  # a meta build gets its tables once it has real memory
    assert meta.rope_cos.dtype == torch.float32 and torch.equal(meta.rope_cos, want)


def _no_cache_greedy(m, row: list[int], n: int) -> list[int]:
    """Greedy continuation by full causal forwards without a cache (the reference)."""
    seq = list(row)
    with torch.no_grad():
        for _ in range(n):
            ids = torch.tensor(seq)
            meta = build_attention_metadata([len(seq)], [0], [[0]], len(seq), "cpu")
            seq.append(int(m.compute_logits(m(ids, torch.arange(len(seq)), None, meta)[-1:]).argmax(-1)))
    return seq[len(row):]


@pytest.mark.parametrize("name", FAMILIES)
def test_generate_is_greedy_cached_and_batched(name):
    m = _direct(name)
    prompt = torch.tensor([[5, 9, 17, 33, 2], [100, 4, 4, 8, 120]])
    out = m.generate(prompt, max_new_tokens=6, ignore_eos=True)
    assert out.shape == (2, 11) and torch.equal(out[:, :5], prompt)
    for b in range(2):
        assert out[b, 5:].tolist() == _no_cache_greedy(m, prompt[b].tolist(), 6)


def test_generate_pads_rows_after_eos():
    m = _direct("dsv4")
    prompt = torch.tensor([[5, 9, 17, 33, 2], [100, 4, 4, 8, 120]])
    free = m.generate(prompt, max_new_tokens=6, ignore_eos=True)
    eos = int(free[0, 6])  # row 0's second new token
    for pad, kw in ((eos, {}), (0, {"pad_token_id": 0})):
        out = m.generate(prompt, max_new_tokens=6, eos_token_id=eos, **kw)
        assert out.shape == (2, 11)
        for b in range(2):
            new = free[b, 5:].tolist()
            stop = new.index(eos) + 1 if eos in new else len(new)
            assert out[b, 5:].tolist() == new[:stop] + [pad] * (len(new) - stop)
    assert out[0, 5:].tolist()[2:] == [0] * 4


def test_generate_one_dimensional_prompt_and_seeded_sampling():
    m = _direct("deepseek-v3.2")
    row = torch.tensor([3, 1, 4, 1, 5])
    one = m.generate(row, max_new_tokens=3)
    assert one.shape == (8,) and torch.equal(one, m.generate(row[None], max_new_tokens=3)[0])
    kw = dict(max_new_tokens=8, temperature=1.0, top_k=50, top_p=0.9, seed=7, ignore_eos=True)
    a = m.generate(torch.stack([row, row]), **kw)
    assert torch.equal(a, m.generate(torch.stack([row, row]), **kw))  # reproducible
    assert not torch.equal(a[0], a[1])  # seed + row: identical prompts still sample independently


@pytest.mark.parametrize("prompt, kw, match", [
    (torch.tensor([[1.0, 2.0]]), {}, "integer token ids"),
    (torch.tensor([[1, 128]]), {}, "outside the vocabulary"),
    (torch.zeros(1, 2, 2, dtype=torch.long), {}, "shape"),
    (torch.tensor([[1, 2]]), {"max_new_tokens": -1}, "max_new_tokens"),
    (torch.tensor([[1, 2]]), {"max_new_tokens": 40}, "context length"),
])
def test_generate_refuses_bad_input(prompt, kw, match):
    with pytest.raises(ConfigError, match=match):
        _direct("llama3").generate(prompt, **kw)


@pytest.mark.parametrize("name", FAMILIES)
def test_save_pretrained_from_pretrained_round_trip(name, tmp_path):
    cls, _ = FAMILIES[name]
    m = _direct(name)
    m.save_pretrained(tmp_path)
    back = cls.from_pretrained(tmp_path)
    assert type(back) is cls and back.family.name == name and not back.training
    ids = torch.tensor([7, 3, 90, 11, 2, 64])
    with torch.no_grad():
        torch.testing.assert_close(back.compute_logits(back(ids, torch.arange(6))), m.compute_logits(m(ids, torch.arange(6))),
                                   atol=0, rtol=0)
    prompt = ids.view(2, 3)
    assert torch.equal(back.generate(prompt, max_new_tokens=5), m.generate(prompt, max_new_tokens=5))
    bf16 = cls.from_pretrained(str(tmp_path), device="cpu", dtype="bfloat16")
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16


def test_from_pretrained_refuses_another_family(tmp_path):
    _direct("dsv4").save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="is a dsv4 checkpoint; DeepSeekV32ForCausalLM loads deepseek-v3.2"):
        DeepSeekV32ForCausalLM.from_pretrained(tmp_path)


def test_module_save_pretrained_infers_the_family(tmp_path):
    """``torchinferno.save_pretrained`` used to assume llama3 for a model without ``.family``."""
    m = _direct("dsv4")
    torchinferno.save_pretrained(m, tmp_path / "d")
    back = torchinferno.load_model_auto(tmp_path / "d")
    assert back.family.name == "dsv4"
    with pytest.raises(ConfigError, match="cannot tell the model family of Linear; pass family_name"):
        torchinferno.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")
    with pytest.raises(ConfigError, match="does not match"):
        torchinferno.save_pretrained(m, tmp_path / "y", family_name="llama3")
