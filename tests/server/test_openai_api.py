"""The official openai client against a live server: streaming == non-streaming == LLM.generate."""

import httpx
import pytest

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.base + "/v1", api_key="unused", max_retries=0)


def _engine_reference(tiny_server, prompt_ids, max_tokens):
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import generate

    from torchinferno.engine.assembly import ModelSpec, build_model

    model = build_model(ModelSpec(model_kind="llama3", dtype="float32"))  # the server's model, rebuilt here (seeded)
    tok = tiny_server.engine.tokenizer
    return generate(model, [prompt_ids], SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), tokenizer=tok)[0]


def test_models_lists_root_and_len(client):
    m = client.models.list().data[0]
    assert m.id == "tiny" and m.model_extra["max_model_len"] == 128 and m.model_extra["root"] == "random:llama3"


def test_completion_stream_equals_nonstream_equals_generate(client, tiny_server):
    kw = dict(model="tiny", prompt="hello world", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert full.choices[0].text == streamed
    assert full.choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert full.usage.prompt_tokens == len(tiny_server.engine.tokenizer.encode("hello world"))
    ref = _engine_reference(tiny_server, tiny_server.engine.tokenizer.encode("hello world"), 12)
    assert ref.text == full.choices[0].text


def test_chat_stream_equals_nonstream(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 10


def test_n_and_seed(client):
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=1.0, seed=5, n=3,
                                  extra_body={"ignore_eos": True})
    again = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=1.0, seed=5, n=3,
                                      extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert [c.text for c in r.choices] == [c.text for c in again.choices]
    assert r.usage.completion_tokens == 18


def test_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs.content
    assert len(lp) == 3 and all(len(t.top_logprobs) == 2 for t in lp)
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-5) for t in lp)  # greedy picks the top


def test_tokenize_detokenize_roundtrip(tiny_server):
    base = tiny_server.base
    t = httpx.post(base + "/tokenize", json={"prompt": "héllo"}).json()
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] == 128
    d = httpx.post(base + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert "héllo" in d["prompt"]


def test_health_version_metrics(tiny_server, client):
    base = tiny_server.base
    assert httpx.get(base + "/health").status_code == 200
    assert "version" in httpx.get(base + "/version").json()
    client.completions.create(model="tiny", prompt="m", max_tokens=2)
    text = httpx.get(base + "/metrics").text
    for name in ("torchinferno_num_requests_running", "torchinferno_kv_cache_usage_perc", "torchinferno_time_to_first_token_seconds_bucket",
                 "torchinferno_generation_tokens_total", "torchinferno_prefix_cache_queries", "torchinferno_num_preemptions"):
        assert name in text, name
