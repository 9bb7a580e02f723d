"""Property-based fuzzing of request bodies over every POST route of our OpenAPI schema: whatever the body (wrong
types, huge or non-finite numbers, deep nesting, unknown fields, raw garbage), the answer is a 2xx or an
OpenAI-shaped 4xx, never a 5xx, and the server keeps serving (issue 18, item 1)."""

import json

import httpx
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "stop_token_ids", "n", "stream", "stream_options", "ignore_eos", "logprobs",
          "top_logprobs", "echo", "suffix", "tokens", "add_special_tokens", "add_generation_prompt",
          "presence_penalty", "user"]

numbers = st.one_of(
    st.integers(min_value=-3, max_value=40), st.integers(), st.integers(min_value=2**62, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, -1, 0.5, 1e308, -0.0]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12), st.just("tiny"))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["role", "content", "type", "text", "include_usage"]),
                                                inner, max_size=3)), max_leaves=12)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "wizard"]),
                                           "content": st.one_of(st.text(max_size=8), json_values)}), max_size=3)
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8).flatmap(
    lambda d: st.fixed_dictionaries({"model": st.just("tiny"), "prompt": st.one_of(st.text(min_size=1, max_size=8),
                                                                                   st.lists(st.integers(0, 400), max_size=5)),
                                     "messages": messages, "max_tokens": st.integers(1, 4)}).map(lambda base: {**base, **d}))


def _raw_variants():
    """Bodies no dict can express: huge digit strings, deep nesting, non-JSON, a non-object top level."""
    return st.one_of(
        st.integers(21, 6000).map(lambda n: b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * n + b"}"),
        st.integers(60, 5000).map(lambda n: b'{"prompt": ' + b"[" * n + b"]" * n + b"}"),
        st.binary(max_size=40), st.sampled_from([b"", b"null", b"[]", b'"x"', b"1e999", b"{", b'{"a": NaN}']))


def _post_paths(base: str) -> list[str]:
    schema = httpx.get(base + "/openapi.json").json()
    return sorted(p for p, ops in schema["paths"].items() if "post" in ops)


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow], database=None)


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.base, timeout=60) as c:  # keep-alive: a reset connection would show
        yield c


def test_schema_lists_the_routes(tiny_server):
    assert {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"} <= set(_post_paths(tiny_server.base))


@FUZZ
@given(body=bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]))
def test_fuzzed_json_bodies_never_5xx(http, body, path):
    raw = json.dumps(body, allow_nan=True).encode()  # NaN/Infinity literals included on purpose
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    _check(r)


@FUZZ
@given(raw=_raw_variants(), path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]))
def test_fuzzed_raw_bodies_are_4xx(http, raw, path):
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    _check(r)
    assert r.status_code >= 400


def test_server_still_serves_after_fuzzing(tiny_server, http):
    for path in _post_paths(tiny_server.base):
        _check(http.post(path, content=b"[" * 100_000))
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/completions", json={"model": "tiny", "prompt": "ok", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
