"""Streams carry every token's logprob entry, equal entry by entry to the non-stream response; ``bytes`` are the
token's own bytes (issue 18, items 3 and 4).

The tiny random model samples byte ids >= 0x80 (parts of UTF-8 characters: empty text deltas) and special ids
(no text under ignore_eos) often at temperature 1, which is what used to drop entries from streams."""

import json

import httpx
import pytest

N_TOKENS = 48


def _sse(base: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", base + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _body(seed: int, **kw) -> dict:
    return {"model": "tiny", "max_tokens": N_TOKENS, "temperature": 1.0, "seed": seed, "ignore_eos": True, **kw}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_completion_stream_logprobs_equal_nonstream(tiny_server, seed):
    body = _body(seed, prompt="héllo", logprobs=2)
    full = httpx.post(tiny_server.base + "/v1/completions", json=body, timeout=60).json()
    chunks = _sse(tiny_server.base, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    ref = full["choices"][0]
    lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for ch in c["choices"]:
            for k, acc in lp.items():
                acc.extend(ch["logprobs"][k])
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == ref["text"]
    assert len(lp["tokens"]) == len(ref["logprobs"]["tokens"]) == N_TOKENS == chunks[-1]["usage"]["completion_tokens"]
    assert lp == ref["logprobs"]
    offs = lp["text_offset"]
    assert offs == sorted(offs) and offs[0] == 0 and offs[-1] <= len(ref["text"])


@pytest.mark.parametrize("seed", [4, 5])
def test_chat_stream_logprobs_equal_nonstream(tiny_server, seed):
    body = _body(seed, messages=[{"role": "user", "content": "🙂"}], logprobs=True, top_logprobs=3)
    full = httpx.post(tiny_server.base + "/v1/chat/completions", json=body, timeout=60).json()
    chunks = _sse(tiny_server.base, "/v1/chat/completions", {**body, "stream": True})
    streamed = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    ref = full["choices"][0]["logprobs"]["content"]
    assert len(streamed) == len(ref) == full["usage"]["completion_tokens"] == N_TOKENS
    assert streamed == ref
    assert "".join(ch["delta"].get("content", "") for c in chunks for ch in c["choices"]) == full["choices"][0]["message"]["content"]


def test_bytes_are_the_tokens_own_bytes(tiny_server):
    tok = tiny_server.app.state.tokenizer
    seen_partial = False
    for seed in (6, 7):
        body = _body(seed, messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=2)
        content = httpx.post(tiny_server.base + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]["content"]
        for e in content:
            ids = tok.encode(e["token"], add_special_tokens=False) if "\ufffd" not in e["token"] else None
            if ids is None:  # a byte that is part of a UTF-8 character: its own byte, not U+FFFD's three
                seen_partial = True
                assert len(e["bytes"]) == 1 and e["bytes"][0] >= 0x80, e
            for t in e["top_logprobs"]:
                assert "\ufffd".encode() != bytes(t["bytes"])
    assert seen_partial, "the sampled tokens included bytes of multi-byte characters"


def test_echo_logprobs_include_the_prompt_with_offsets(tiny_server):
    prompt = "hello world, hi"
    body = _body(8, prompt=prompt, echo=True, logprobs=3)
    full = httpx.post(tiny_server.base + "/v1/completions", json=body, timeout=60).json()
    ch, usage = full["choices"][0], full["usage"]
    lp = ch["logprobs"]
    assert len(lp["tokens"]) == usage["prompt_tokens"] + usage["completion_tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v is not None for v in lp["token_logprobs"][1:])
    assert ch["text"].startswith(prompt)
    for tok, off in zip(lp["tokens"][: usage["prompt_tokens"]], lp["text_offset"]):
        if tok != "<bos>":
            assert ch["text"][off : off + len(tok)] == tok
    assert lp["text_offset"][usage["prompt_tokens"]] == len(prompt)  # the first generated token follows the echo

    # The prompt's last entry is what the model predicts after the prompt minus its last token.
    ids = tiny_server.app.state.tokenizer.encode(prompt)
    nxt = httpx.post(tiny_server.base + "/v1/completions", timeout=60,
                     json={"model": "tiny", "prompt": ids[:-1], "max_tokens": 1, "temperature": 0, "logprobs": 3}).json()
    want = nxt["choices"][0]["logprobs"]["top_logprobs"][0]
    got = lp["top_logprobs"][len(ids) - 1]
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-4 for k in want)

    chunks = _sse(tiny_server.base, "/v1/completions", {**body, "stream": True})
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for k, acc in streamed.items():
            acc.extend(c["choices"][0]["logprobs"][k])
    assert "".join(c["choices"][0]["text"] for c in chunks) == ch["text"]
    assert streamed == lp
