"""`serve --model tiny --model-kind tiny-deepseek-v4` answers an OpenAI completion with plain generation's text."""

import pytest

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.assembly import ModelSpec, build_model
from torchinferno.engine.generate import generate
from torchinferno.server.live import LiveServer

openai = pytest.importorskip("openai")


def test_serve_tiny_deepseek_v4_completion_equals_generate():
    args = ["--model", "tiny", "--model-kind", "tiny-deepseek-v4", "--tokenizer", "byte", "--device", "cpu",
            "--dtype", "float32", "--max-model-len", "64", "--max-num-seqs", "2", "--block-size", "4"]
    with LiveServer(args) as s:
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        name = client.models.list().data[0].id
        r = client.completions.create(model=name, prompt="deepseek v4 says", max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
        tok = s.engine.tokenizer
    model = build_model(ModelSpec(model_kind="deepseek-v4", dtype="float32"))  # the server's model, rebuilt (seeded)
    ref = generate(model, [tok.encode("deepseek v4 says")], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                   tokenizer=tok)[0]
    assert r.usage.completion_tokens == 8 and len(ref.token_ids) == 8
    assert r.choices[0].text == ref.text and ref.text.strip()
