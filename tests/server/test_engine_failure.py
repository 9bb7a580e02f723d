"""Failures never leave a plain-text body: a dead engine (its thread with --engine-in-process, its core process
otherwise) turns /health and every request into an OpenAI-shaped 503, an unexpected exception into an
OpenAI-shaped 500 (counted), unknown routes into 404s."""

import argparse
import json
import os
import signal
import time

import pytest
from fastapi.testclient import TestClient

from torchinferno.server.launch import add_server_args, build

BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 3}
ARGS = ["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "64", "--served-model-name", "tiny",
        "--max-num-seqs", "4"]


def _app(extra: list[str]):
    p = argparse.ArgumentParser()
    add_server_args(p)
    return build(p.parse_args([*ARGS, *extra]))


def _assert_openai_error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


@pytest.fixture
def app_engine():
    """The in-process engine (its step can be monkeypatched to fail)."""
    app, _, engine = _app(["--engine-in-process"])
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, engine
    engine.shutdown()


@pytest.fixture
def app_core():
    """The default layout: the engine core in its own process."""
    app, _, engine = _app([])
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, engine
    engine.shutdown()


def _errors_counted(client, status: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("torchinferno_request_errors_total{") and f'status="{status}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_engine_death_gives_503_everywhere(app_engine):
    client, engine = app_engine
    assert client.get("/health").status_code == 200
    assert client.post("/v1/completions", json=BODY).status_code == 200

    def boom():
        raise RuntimeError("step exploded")

    engine.engine.step = boom  # the engine thread's next step raises and the thread stops
    err = _assert_openai_error(client.post("/v1/completions", json=BODY), 503)  # the request in flight
    assert "step exploded" in err["message"] and err["code"] == "engine_not_running"
    assert not engine.is_running
    _assert_openai_error(client.get("/health"), 503)
    for path, body in [("/v1/completions", BODY), ("/v1/completions", {**BODY, "stream": True}),
                       ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/chat/completions", {"model": "tiny", "stream": True,
                                                 "messages": [{"role": "user", "content": "hi"}]})]:
        _assert_openai_error(client.post(path, json=body), 503)
    assert _errors_counted(client, "503") == 5


def test_engine_death_mid_stream_ends_with_error_event(app_engine):
    client, engine = app_engine
    real_step, calls = engine.engine.step, []

    def step_then_die():
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("died mid-stream")
        return real_step()

    engine.engine.step = step_then_die
    with client.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 20, "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        events = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "engine_not_running" and "died mid-stream" in err["message"]


def test_unexpected_exception_is_openai_500_and_counted(app_engine, monkeypatch):
    client, _ = app_engine
    from torchinferno.text.byte_tokenizer import ByteTokenizer

    def broken(*a, **k):
        raise ValueError("template bug")

    monkeypatch.setattr(ByteTokenizer, "encode_chat", broken)
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    err = _assert_openai_error(r, 500)
    assert "ValueError" in err["message"] and err["type"] == "server_error"
    assert _errors_counted(client, "500") == 1
    assert client.get("/health").status_code == 200  # a request bug does not take the engine down


@pytest.mark.parametrize("method,path,status", [("get", "/v1/nope", 404), ("get", "/v1/completions", 405)])
def test_unknown_routes_are_openai_errors(app_engine, method, path, status):
    client, _ = app_engine
    _assert_openai_error(getattr(client, method)(path), status)


def test_killed_core_process_mid_stream_then_503_everywhere(app_core):
    client, engine = app_core
    assert client.get("/health").status_code == 200
    with client.stream("POST", "/v1/completions",
                       json={**BODY, "max_tokens": 50, "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        events = []
        for ln in r.iter_lines():
            if not ln.startswith("data: "):
                continue
            events.append(ln[len("data: "):])
            if len(events) == 3:
                os.kill(engine.core.pid, signal.SIGKILL)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "engine_not_running" and "exited" in err["message"]
    deadline = time.time() + 10
    while engine.is_running and time.time() < deadline:
        time.sleep(0.05)
    _assert_openai_error(client.get("/health"), 503)
    _assert_openai_error(client.post("/v1/completions", json=BODY), 503)
