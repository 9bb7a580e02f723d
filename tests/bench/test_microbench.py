"""openai-microbench (synthetic and tiny model) and openai-server-microbench."""

import json

import pytest

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
    # a loaded host may deliver a request's 4 tokens in one streamed chunk (the server drains what the engine made
    # since its last write): TPOT is then 0, not negative
    assert 0 < s["ttft_ms"]["mean"] <= s["e2e_ms"]["mean"] and s["tpot_ms"]["mean"] >= 0
    assert s["output_tokens_per_s"] > 0
    assert r["non_stream"]["e2e_ms"]["mean"] > 0 and r["non_stream"]["output_tokens_per_s"] > 0


def test_readme_model_backend_flags_parse_and_an_unreachable_model_fails_in_one_line(capsys):
    """The README's torchrun line: --llama-parallelism tensor --tensor-parallel-size 8 --trust-remote-code (here the
    hub is unreachable and nothing is cached: one line naming the model, no worker started)."""
    rc = main(["openai-microbench", "--backend", "model", "--model", "meta-llama/Meta-Llama-3.1-70B-Instruct",
               "--llama-parallelism", "tensor", "--tensor-parallel-size", "8", "--trust-remote-code",
               "--compare-batcher", "--prompt-tokens", "32", "--max-tokens", "67"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "Meta-Llama-3.1-70B-Instruct" in err[0], err


@pytest.mark.parametrize("parallelism", ["tensor", "pipeline"])
def test_model_backend_on_two_ranks(tmp_path, capsys, parallelism):
    """--tensor-parallel-size 2 spawns gloo worker ranks per case (tensor: every layer split; pipeline: two stages)
    and stops them: the same forwards and tokens as one process, no child process left."""
    import multiprocessing

    def run(extra):
        out = tmp_path / f"mb{len(extra)}.json"
        rc = main(["openai-microbench", "--backend", "model", "--model-kind", "llama3", "--concurrency", "2",
                   "--prompt-tokens", "8", "--max-tokens", "4", "--single-requests", "1", "--json-output", str(out),
                   *extra])
        assert rc == 0
        return {c["case"]: c for c in json.loads(out.read_text())["cases"]}

    before = set(multiprocessing.active_children())  # (a session fixture's server may be running)
    one = run([])
    two = run(["--tensor-parallel-size", "2", "--llama-parallelism", parallelism])
    assert f"ranks=2 ({parallelism})" in capsys.readouterr().out
    for case in ("direct", "concurrent"):
        assert two[case]["output_tokens"] == one[case]["output_tokens"] == 4 * two[case]["requests"]
    assert two["direct"]["forward_calls"] == one["direct"]["forward_calls"] == 4
    assert set(multiprocessing.active_children()) <= before


def test_phase_timings_need_the_in_process_runner():
    from torchinferno.bench.microbench import MicrobenchConfig
    from torchinferno.errors import ConfigError

    with pytest.raises(ConfigError, match="--phase-timings"):
        MicrobenchConfig(backend="model", tensor_parallel_size=2, phase_timings=True).validate()
    with pytest.raises(ConfigError, match="need --backend model"):
        MicrobenchConfig(backend="synthetic", pipeline_parallel_size=2).validate()
