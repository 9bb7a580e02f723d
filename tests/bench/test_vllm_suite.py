"""vllm-bench-suite: plans exactly the argv vLLM 0.11.x accepts; --run without vLLM says so."""

import json
import os
import stat
import sys

import pytest

from torchinferno.bench.vllm_flags import FLAGS, SWITCH, VllmArgvError, check_argv
from torchinferno.cli.main import main


def _plan(tmp_path, *extra):
    d = tmp_path / "suite"
    rc = main(["vllm-bench-suite", str(d), "--model", "facebook/opt-125m", "--tensor-parallel-size", "2",
               "--input-len", "64", "--output-len", "32", "--batch-size", "4", "--num-prompts", "20",
               "--max-concurrency", "1", "8", "--request-rate", "inf", *extra])
    return rc, d, json.loads((d / "commands.json").read_text())


def _flags_of(argv, sub):
    """Every --flag in argv, checked to be in the kept list with the right arity."""
    table = FLAGS[sub]
    i, seen = 0, []
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            assert tok in table, f"{tok} is not a `vllm {sub}` flag"
            seen.append(tok)
            if table[tok] == SWITCH:
                i += 1
                continue
            assert i + 1 < len(argv) and not argv[i + 1].startswith("--"), f"{tok} needs a value"
            i += 2
        else:
            i += 1
    return seen


def test_plan_argv_matches_vllm_flags(tmp_path):
    rc, d, plan = _plan(tmp_path)
    assert rc == 0
    assert not (d / "run_status.json").exists()  # plan mode runs nothing
    assert plan["engine"] == "vllm" and "0.11" in plan["vllm_version_basis"]
    names = [c["name"] for c in plan["commands"]]
    assert names == ["latency", "throughput", "server", "serve-c1", "serve-c8"]
    for c in plan["commands"]:
        argv = c["argv"]
        sub = check_argv(argv)
        if sub == "serve":
            assert argv[:3] == ["vllm", "serve", "facebook/opt-125m"]
            _flags_of(argv[3:], sub)
        else:
            assert argv[:3] == ["vllm", "bench", c["benchmark"]]
            seen = _flags_of(argv[3:], sub)
            assert len(seen) == len(set(seen)), "a flag is repeated"
    lat = plan["commands"][0]["argv"]
    assert lat[lat.index("--output-json") + 1] == str((d / "latency.json").resolve())
    assert lat[lat.index("--tensor-parallel-size") + 1] == "2" and lat[lat.index("--batch-size") + 1] == "4"
    serve = plan["commands"][4]["argv"]
    for flag in ("--save-result", "--save-detailed", "--ignore-eos"):
        assert flag in serve
    assert serve[serve.index("--max-concurrency") + 1] == "8"
    assert serve[serve.index("--random-input-len") + 1] == "64"
    assert serve[serve.index("--result-filename") + 1] == "serve-c8.json"
    assert serve[serve.index("--base-url") + 1] == "http://127.0.0.1:8000"


def test_plan_with_base_url_has_no_server(tmp_path):
    rc, _, plan = _plan(tmp_path, "--base-url", "http://10.0.0.5:9000", "--benchmarks", "serve",
                        "--endpoint", "/v1/chat/completions")
    assert rc == 0
    assert [c["role"] for c in plan["commands"]] == ["bench", "bench"]
    argv = plan["commands"][0]["argv"]
    assert argv[argv.index("--backend") + 1] == "openai-chat"
    assert argv[argv.index("--base-url") + 1] == "http://10.0.0.5:9000"


@pytest.mark.parametrize("argv,msg", [
    (["vllm", "bench", "latency", "--model", "m", "--num-prompts", "3"], "unrecognized"),  # serve-only flag
    (["vllm", "bench", "serve", "--random-input-len"], "expected one argument"),
    (["vllm", "bench", "serve", "--ignore-eos", "yes"], "unrecognized"),
    (["vllm", "bench", "serve", "--backend", "tgi-xx"], "invalid choice"),
    (["vllm", "bench", "serve", "--max-concurency", "4"], "unrecognized"),
    (["vllm", "bench", "latancy"], "unknown vllm bench subcommand"),
])
def test_check_argv_rejects(argv, msg):
    with pytest.raises(VllmArgvError, match=msg):
        check_argv(argv)


def test_run_without_vllm(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    rc, d, plan = _plan(tmp_path, "--run", "--benchmarks", "latency", "serve")
    assert rc != 0
    status = json.loads((d / "run_status.json").read_text())
    assert set(status) == {"latency", "serve-c1", "serve-c8"}
    assert all(s["status"] == "not installed" for s in status.values())
    assert "not installed" in capsys.readouterr().out
    for f in ("summary.json", "performance.csv", "performance.html"):
        assert (d / f).is_file()


FAKE_VLLM = r'''#!{python}
"""Stands in for vLLM: validates argv against the kept flag list, writes a vLLM-shaped result."""
import json, sys
from torchinferno.bench.vllm_flags import check_argv
argv = ["vllm", *sys.argv[1:]]
sub = check_argv(argv)
out = argv[argv.index("--output-json") + 1]
if sub == "bench latency":
    json.dump({{"avg_latency": 0.5, "std_latency": 0.01, "latencies": [0.49, 0.5, 0.51],
               "percentiles": {{"10": 0.49, "25": 0.495, "50": 0.5, "75": 0.505, "90": 0.51, "99": 0.51}}}}, open(out, "w"))
else:
    json.dump({{"elapsed_time": 2.0, "num_requests": 20, "total_num_tokens": 1920, "requests_per_second": 10.0,
               "tokens_per_second": 960.0}}, open(out, "w"))
'''


def test_run_with_fake_vllm(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text(FAKE_VLLM.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    rc, d, _ = _plan(tmp_path, "--run", "--benchmarks", "latency", "throughput", "--vllm-executable", str(exe))
    status = json.loads((d / "run_status.json").read_text())
    assert rc == 0, status
    assert {k: v["status"] for k, v in status.items()} == {"latency": "ok", "throughput": "ok"}
    rows = json.loads((d / "summary.json").read_text())["rows"]
    assert {(r["backend"], r["benchmark"]) for r in rows} == {("vllm", "latency"), ("vllm", "throughput")}
    assert os.path.getsize(d / "performance.html") > 1000


def test_default_plan_is_the_readme_llama70b_tp8(tmp_path):
    """`vllm-bench-suite DIR --benchmarks latency throughput serve`, as the README types it."""
    d = tmp_path / "vllm-llama70b"
    assert main(["vllm-bench-suite", str(d), "--benchmarks", "latency", "throughput", "serve"]) == 0
    cmds = json.loads((d / "commands.json").read_text())["commands"]
    assert [c["name"] for c in cmds] == ["latency", "throughput", "server", "serve"]
    for c in cmds:
        argv = c["argv"]
        assert "meta-llama/Llama-3.3-70B-Instruct" in argv
        if c["name"] != "serve":  # the client needs no parallelism flag
            assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
