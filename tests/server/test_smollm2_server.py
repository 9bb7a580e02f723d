"""The official openai client against a live server on the real default model (SmolLM2)."""

import pytest

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_server():
    from torchinferno.server.live import LiveServer

    s = LiveServer(["smollm2-135m-instruct", "--dtype", "float32", "--max-model-len", "512"])
    yield s
    s.stop()


def test_chat_and_completion_match_plain_generation(smol_server):
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import generate

    client = openai.OpenAI(base_url=smol_server.base + "/v1", api_key="x", max_retries=0)
    from torchinferno.engine.assembly import ModelSpec, build_model

    model = build_model(ModelSpec(model="smollm2-135m-instruct", dtype="float32"))  # the server's model (in its core)
    tok = smol_server.engine.tokenizer
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, max_tokens=24, temperature=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smollm2-135m-instruct", messages=msgs, max_tokens=24, temperature=0, stream=True) if c.choices)
    ref = generate(model, [tok.encode_chat(msgs)], SamplingParams(max_tokens=24, temperature=0.0), tokenizer=tok)[0]
    assert chat.choices[0].message.content == streamed == ref.text
    assert "Paris" in ref.text
    assert chat.usage.prompt_tokens == len(tok.encode_chat(msgs)) and chat.usage.completion_tokens == len(ref.token_ids)

    comp = client.completions.create(model="smollm2-135m-instruct", prompt="The capital of Germany is", max_tokens=8, temperature=0)
    ref = generate(model, [tok.encode("The capital of Germany is")], SamplingParams(max_tokens=8, temperature=0.0), tokenizer=tok)[0]
    assert comp.choices[0].text == ref.text
