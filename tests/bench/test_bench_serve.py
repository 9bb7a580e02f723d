"""bench-serve against a live tiny-model server: vLLM's result keys and metric definitions."""

import json
import math

import pytest

from torchinferno.cli.main import main

VLLM_KEYS = ["date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency", "duration",
             "completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
             "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"]


def _run(tmp_path, base_url, *extra):
    out = tmp_path / "serve.json"
    rc = main(["bench-serve", "--base-url", base_url, "--num-prompts", "6", "--input-len", "12", "--output-len", "6",
               "--ignore-eos", "--disable-tqdm", "--json-output", str(out), *extra])
    return rc, json.loads(out.read_text())


@pytest.mark.parametrize("endpoint,extra", [
    ("/v1/completions", ["--request-rate", "200", "--burstiness", "0.5", "--max-concurrency", "3"]),
    ("/v1/completions", ["--http-client", "httpx"]),
    ("/v1/chat/completions", []),
])
def test_bench_serve_live(tmp_path, tiny_base_url, endpoint, extra):
    rc, r = _run(tmp_path, tiny_base_url, "--endpoint", endpoint, *extra)
    assert rc == 0
    for k in VLLM_KEYS:
        assert k in r, k
    for m in ("ttft", "tpot", "itl", "e2el"):
        for s in ("mean", "median", "std", "p99"):
            assert f"{s}_{m}_ms" in r
    assert r["completed"] == r["num_prompts"] == 6 and r["failed"] == 0
    assert r["model_id"] == "tiny" and r["engine"] == "torchinferno"
    assert r["seed"] == 0  # recorded: sim.traffic.load_trace draws the same arrival gaps from it
    assert r["http_client"] == ("httpx" if "httpx" in extra else "aiohttp")
    assert r["output_lens"] == [6] * 6  # ignore_eos + usage.completion_tokens
    if endpoint == "/v1/completions":
        assert r["input_lens"] == [12] * 6  # token-id prompts of exactly --input-len
        if "--max-concurrency" in extra:
            assert r["max_concurrency"] == 3 and r["request_rate"] == 200 and r["burstiness"] == 0.5
    else:
        assert all(n >= 12 for n in r["input_lens"])  # the chat template adds tokens
        assert r["request_rate"] == "inf"
    tpots = []
    for ttft, e2e, n, itl in zip(r["ttfts"], r["latencies"], r["output_lens"], r["itls"]):
        assert 0 < ttft <= e2e
        assert all(x >= 0 for x in itl) and len(itl) <= n - 1
        tpots.append((e2e - ttft) / (n - 1))  # vLLM's TPOT definition
    assert math.isclose(r["mean_tpot_ms"], 1000 * sum(tpots) / len(tpots), rel_tol=1e-9)
    assert math.isclose(r["mean_ttft_ms"], 1000 * sum(r["ttfts"]) / 6, rel_tol=1e-9)
    assert math.isclose(r["output_throughput"], sum(r["output_lens"]) / r["duration"], rel_tol=1e-9)
    assert r["total_token_throughput"] > r["output_throughput"]


def test_bench_serve_result_dir_naming(tmp_path, tiny_base_url):
    d = tmp_path / "res"
    rc = main(["bench-serve", "--base-url", tiny_base_url + "/v1", "--num-prompts", "2", "--input-len", "4",
               "--output-len", "2", "--disable-tqdm", "--result-dir", str(d), "--max-concurrency", "1"])
    assert rc == 0
    (f,) = list(d.glob("*.json"))
    assert f.name.startswith("openai-infqps-concurrency1-tiny-")


def test_bench_serve_unreachable(tmp_path, capsys):
    from torchinferno.bench.local_server import free_port

    rc = main(["bench-serve", "--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "1", "--disable-tqdm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len(err) == 1 and err[0].startswith("error: cannot reach server at http://127.0.0.1:")


def test_bench_serve_bad_flags(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench-serve", "--base-url", "http://x", "--request-rate", "zero"])
    assert e.value.code != 0
    rc = main(["bench-serve", "--base-url", "ftp://x", "--num-prompts", "1"])
    assert rc == 1 and "must start with http" in capsys.readouterr().err


def test_bench_serve_clients_agree(tmp_path, tiny_base_url):
    """aiohttp and httpx streams parse to the same greedy texts and token counts (the client library changes
    only what the client costs, never what it measures)."""
    runs = {}
    for client in ("aiohttp", "httpx"):
        rc, r = _run(tmp_path, tiny_base_url, "--http-client", client, "--max-concurrency", "2")
        assert rc == 0 and r["http_client"] == client
        runs[client] = r
    assert runs["aiohttp"]["generated_texts"] == runs["httpx"]["generated_texts"]
    assert runs["aiohttp"]["output_lens"] == runs["httpx"]["output_lens"] == [6] * 6


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_bench_serve_error_status(tmp_path, tiny_base_url, client):
    """A non-200 answer becomes a failed request naming the status and the server's message, on either client."""
    _, r = _run(tmp_path, tiny_base_url, "--http-client", client, "--model", "no-such-model")
    assert r["completed"] == 0 and r["failed"] == 6
    assert all(e.startswith("HTTP 404:") and "no-such-model" in e for e in r["errors"]), r["errors"][0]


def test_warmups_send_prompts_of_their_own(tmp_path, tiny_base_url, monkeypatch):
    """Warm-up requests use prompts drawn after the measured ones: the measured prompts are those of a run without
    warm-ups, and none of them is in the prefix cache because a warm-up sent it (run 72's first C 1 request was)."""
    from torchinferno.bench import serve_client

    sent = []
    real = serve_client.send_request

    async def spy(client, cfg, model, prompt):
        sent.append(tuple(prompt.value) if isinstance(prompt.value, list) else prompt.value)
        return await real(client, cfg, model, prompt)

    monkeypatch.setattr(serve_client, "send_request", spy)
    assert _run(tmp_path, tiny_base_url, "--num-warmups", "0")[0] == 0
    measured, sent[:] = list(sent), []
    assert _run(tmp_path, tiny_base_url, "--num-warmups", "2")[0] == 0
    warm, again = sent[:2], sent[2:]
    assert again == measured and len(set(measured)) == 6
    assert not set(warm) & set(measured)


def test_prompt_offsets_are_distinct_and_stable():
    import random

    from torchinferno.bench.serve_prompts import _distinct_starts

    a = _distinct_starts(random.Random(3), 600, 512)
    assert len(set(a)) == 512 and all(0 <= s < 600 for s in a)  # enough offsets: no window repeats
    assert _distinct_starts(random.Random(3), 600, 514)[:512] == a  # more prompts (warm-ups) leave these as they are
    few = _distinct_starts(random.Random(3), 4, 6)
    assert set(few) == {0, 1, 2, 3} and len(few) == 6  # too few offsets: all used, then repeats
