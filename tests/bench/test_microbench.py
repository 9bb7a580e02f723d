"""openai-microbench (synthetic and tiny model) and openai-server-microbench."""

import json

from torchinferno.cli.main import main


def test_synthetic_compare_batcher(tmp_path, capsys):
    out = tmp_path / "mb.json"
    rc = main(["openai-microbench", "--backend", "synthetic", "--compare-batcher", "--concurrency", "4",
               "--prompt-tokens", "8", "--max-tokens", "6", "--step-ms", "1", "--single-requests", "2",
               "--phase-timings", "--profile-breakdown", "--json-output", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    cases = {c["case"]: c for c in r["cases"]}
    assert list(cases) == ["direct", "batcher", "batcher-concurrent", "concurrent"]
    d = cases["direct"]
    assert d["forward_calls"] == 2 * 6 and d["max_batch"] == 1 and d["output_tokens"] == 12
    assert d["ttft_ms"] >= 1.0 and d["ttft_ms"] <= d["e2e_ms"]
    assert cases["batcher"]["forward_calls"] == 12
    for name in ("batcher-concurrent", "concurrent"):
        c = cases[name]
        assert c["requests"] == 4 and c["output_tokens"] == 24
        assert c["max_batch"] >= 2 and c["forward_calls"] < 24  # requests shared forwards
    assert d["phases"]["forward_s"] > 0 and "non_forward_us_per_token" in d["phases"]
    assert cases["concurrent"]["profile"]
    assert "batcher_overhead_ms_per_token" in r
    assert "batcher overhead vs direct" in capsys.readouterr().out


def test_model_backend_self_consistency(tmp_path):
    out = tmp_path / "mb.json"
    rc = main(["openai-microbench", "--backend", "model", "--model-kind", "llama3", "--concurrency", "3",
               "--prompt-tokens", "16", "--max-tokens", "4", "--prompt-mode", "self-consistency", "--single-requests", "1",
               "--json-output", str(out)])
    assert rc == 0
    cases = {c["case"]: c for c in json.loads(out.read_text())["cases"]}
    assert cases["direct"]["forward_calls"] == 4
    assert cases["concurrent"]["output_tokens"] == 12


def test_server_microbench_base_url(tmp_path, tiny_base_url):
    out = tmp_path / "smb.json"
    rc = main(["openai-server-microbench", "--base-url", tiny_base_url, "--warmup", "1", "--iters", "2",
               "--prompt-tokens", "8", "--max-tokens", "4", "--json-output", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["engine"] == "torchinferno" and r["model"] == "tiny"
    s = r["stream"]
    assert 0 < s["ttft_ms"]["mean"] <= s["e2e_ms"]["mean"] and s["tpot_ms"]["mean"] > 0
    assert r["non_stream"]["e2e_ms"]["mean"] > 0 and r["non_stream"]["output_tokens_per_s"] > 0


def test_readme_model_backend_flags_parse_and_tp_is_refused_in_one_line(capsys):
    """The README's torchrun line: --llama-parallelism tensor --tensor-parallel-size 8 --trust-remote-code."""
    rc = main(["openai-microbench", "--backend", "model", "--model", "meta-llama/Meta-Llama-3.1-70B-Instruct",
               "--llama-parallelism", "tensor", "--tensor-parallel-size", "8", "--trust-remote-code",
               "--compare-batcher", "--prompt-tokens", "32", "--max-tokens", "67"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "--tensor-parallel-size" in err[0], err
