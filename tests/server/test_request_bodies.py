"""Hostile request bodies get an OpenAI 4xx naming the field (never a 5xx), a bug is a counted JSON 500 that keeps
the connection alive, and limits/accounting hold (issue 18, items 1, 2 and 6)."""

import json
import socket
import time

import httpx
import pytest

from torchinferno.server.body import MAX_DEPTH, decode_json_object
from torchinferno.server.protocol import BadRequest

COMPLETION = {"model": "tiny", "prompt": "x", "max_tokens": 2}


def _raw(base: str, path: str, raw: bytes) -> httpx.Response:
    return httpx.post(base + path, content=raw, headers={"content-type": "application/json"})


def _check_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if param is not None:
        assert err["param"] == param and param in err["message"], err
    return err


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize", "/v1/chat/completions"])
def test_huge_integer_is_400_naming_the_field(tiny_server, path):
    raw = b'{"model": "tiny", "prompt": "x", "messages": [], "max_tokens": ' + b"9" * 5001 + b"}"
    _check_error(_raw(tiny_server.base, path, raw), 400, "max_tokens")


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_integers_beyond_64_bits_are_400(tiny_server, value):
    raw = json.dumps({**COMPLETION, "seed": value}).encode()
    _check_error(_raw(tiny_server.base, "/v1/completions", raw), 400, "seed")


def test_int64_edges_are_accepted_by_the_decoder():
    assert decode_json_object(b'{"a": 9223372036854775807, "b": -9223372036854775808}') == {"a": 2**63 - 1, "b": -(2**63)}


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                 b'{"x": ' + b'{"y": ' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 2)])
@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
def test_deep_nesting_is_400(tiny_server, raw, path):
    err = _check_error(_raw(tiny_server.base, path, raw), 400)
    assert "nested" in err["message"] or "JSON object" in err["message"], err


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                   "repetition_penalty"])
@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers_are_400_naming_the_field(tiny_server, field, literal):
    raw = b'{"model": "tiny", "prompt": "x", "max_tokens": 2, "%s": %s}' % (field.encode(), literal)
    _check_error(_raw(tiny_server.base, "/v1/completions", raw), 400, field)


def test_non_finite_inside_messages_names_the_path(tiny_server):
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi", "weight": NaN}]}'
    _check_error(_raw(tiny_server.base, "/v1/chat/completions", raw), 400, "messages.0.weight")


def test_sampling_params_reject_non_finite_for_any_caller():
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.errors import SamplingError

    for name in ("temperature", "top_p", "min_p"):
        with pytest.raises(SamplingError, match=name):
            SamplingParams(**{name: float("nan")}).validate()


def test_stream_options_without_stream_is_400(tiny_server):
    r = httpx.post(tiny_server.base + "/v1/completions", json={**COMPLETION, "stream_options": {"include_usage": True}})
    _check_error(r, 400, "stream_options")
    ok = httpx.post(tiny_server.base + "/v1/completions", json={**COMPLETION, "stream_options": None})
    assert ok.status_code == 200


def test_prompts_times_n_is_capped(tiny_server):
    r = httpx.post(tiny_server.base + "/v1/completions", json={**COMPLETION, "prompt": ["a"] * 64, "n": 16})
    err = _check_error(r, 400, "n")
    assert "1024" in err["message"]


def _metric(base: str, name: str, **labels) -> float:
    text = httpx.get(base + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _two_requests_on_one_socket(port: int, body: bytes) -> list[bytes]:
    """Send two keep-alive POST /detokenize on one TCP connection; return the status lines received."""
    req = (b"POST /detokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
           % (len(body), body))
    lines = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for _ in range(2):
            s.sendall(req)
            buf = b""
            while b"\r\n\r\n" not in buf:
                got = s.recv(65536)
                if not got:
                    return lines
                buf += got
            head, rest = buf.split(b"\r\n\r\n", 1)
            length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
            while len(rest) < length:
                rest += s.recv(65536)
            lines.append(head.split(b"\r\n")[0])
    return lines


def test_a_bug_is_a_counted_json_500_and_keep_alive_survives(tiny_server, monkeypatch):
    tok = tiny_server.app.state.tokenizer

    def broken(*a, **k):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(tok, "decode", broken)
    before = _metric(tiny_server.base, "torchinferno_request_errors_total", status="500")
    r = httpx.post(tiny_server.base + "/detokenize", json={"tokens": [65]})
    err = _check_error(r, 500)
    assert err["type"] == "server_error" and "injected bug" in err["message"]
    assert _metric(tiny_server.base, "torchinferno_request_errors_total", status="500") == before + 1
    assert _two_requests_on_one_socket(tiny_server.port, b'{"tokens": [65]}') == [b"HTTP/1.1 500 Internal Server Error"] * 2
    monkeypatch.undo()
    assert httpx.post(tiny_server.base + "/v1/completions", json=COMPLETION).status_code == 200


def test_aborted_requests_are_counted(tiny_server):
    before = _metric(tiny_server.base, "torchinferno_request_success_total", finished_reason="abort")
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 100, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", tiny_server.base + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break
    deadline = time.time() + 10
    while time.time() < deadline:
        if _metric(tiny_server.base, "torchinferno_request_success_total", finished_reason="abort") >= before + 1:
            break
        time.sleep(0.05)
    assert _metric(tiny_server.base, "torchinferno_request_success_total", finished_reason="abort") == before + 1


def test_decode_json_object_errors_are_bad_requests():
    for raw in [b"\xff", b"{", b"[]", b"[" * 10_000, b'{"a": 1' + b"0" * 30 + b"}", b'{"a": NaN}']:
        with pytest.raises(BadRequest):
            decode_json_object(raw)


def test_kv_cache_memory_alone_leaves_max_model_len_to_the_pool():
    import argparse

    from torchinferno.server.args import add_server_args, engine_config_from_args

    p = argparse.ArgumentParser()
    add_server_args(p)
    cfg = engine_config_from_args(p.parse_args(["smollm2-135m-instruct", "--kv-cache-memory", "32MiB"]), 8192)
    assert cfg.max_model_len is None  # the engine caps the model's context by the pool (issue 18, item 6)
    cfg = engine_config_from_args(p.parse_args(["x", "--max-model-len", "512"]), 8192)
    assert cfg.max_model_len == 512
