"""--api-key guards every route but /health; the body-size and choices limits are flags (issue 18, items 5, 1, 6)."""

import httpx
import pytest

from torchinferno.server.app import ServerConfig

KEY = {"Authorization": "Bearer sekret"}
ROUTES = [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/docs"), ("GET", "/openapi.json"),
          ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
          ("GET", "/no/such/route")]


@pytest.fixture(scope="module")
def keyed_server():
    from torchinferno.server.live import LiveServer

    s = LiveServer(["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "64", "--api-key", "sekret",
                    "--served-model-name", "tiny", "--max-request-body-bytes", "2000", "--max-choices-per-request", "4"])
    yield s
    s.stop()


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_but_health_needs_the_key(keyed_server, method, path):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1, "tokens": [65], "messages": [{"role": "user", "content": "x"}]}
    kw = {"json": body} if method == "POST" else {}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "sekret"}):
        r = httpx.request(method, keyed_server.base + path, headers=headers, **kw)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    r = httpx.request(method, keyed_server.base + path, headers=KEY, **kw)
    assert r.status_code == (404 if path == "/no/such/route" else 200), r.text


def test_health_stays_open(keyed_server):
    assert httpx.get(keyed_server.base + "/health").status_code == 200


def test_body_over_the_limit_is_413(keyed_server):
    big = {"model": "tiny", "prompt": "x" * 3000, "max_tokens": 1}
    r = httpx.post(keyed_server.base + "/v1/completions", json=big, headers=KEY)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text

    def chunks():  # no Content-Length: the cap holds while reading
        for _ in range(10):
            yield b" " * 500

    r = httpx.post(keyed_server.base + "/tokenize", content=chunks(), headers={**KEY, "content-type": "application/json"})
    assert r.status_code == 413, r.text
    ok = httpx.post(keyed_server.base + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1}, headers=KEY)
    assert ok.status_code == 200


def test_choices_cap_is_a_flag(keyed_server):
    body = {"model": "tiny", "prompt": ["a", "b", "c"], "max_tokens": 1, "n": 2}
    r = httpx.post(keyed_server.base + "/v1/completions", json=body, headers=KEY)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    body["prompt"] = ["a", "b"]
    assert httpx.post(keyed_server.base + "/v1/completions", json=body, headers=KEY).status_code == 200


def test_models_never_shows_an_absolute_path():
    cfg = ServerConfig(model_name="smollm2-135m-instruct", root="/home/u/.cache/torchinferno/models/x", max_model_len=8)
    assert cfg.public_root() == "smollm2-135m-instruct"
    assert ServerConfig("tiny", "random:llama3", 8).public_root() == "random:llama3"
