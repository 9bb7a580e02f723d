"""llama-bench-suite on a tiny random llama3: vLLM-shaped files, a real online run, one report."""

import json
import math
from html.parser import HTMLParser

from torchinferno.bench.results import load_results
from torchinferno.cli.main import main

ARGS = ["--model-kind", "llama3", "--dtype", "float32", "--input-len", "12", "--output-len", "6", "--batch-size", "2",
        "--num-prompts", "6", "--num-iters", "2", "--num-iters-warmup", "1"]


def test_plan_only(tmp_path, capsys):
    d = tmp_path / "plan"
    assert main(["llama-bench-suite", str(d), *ARGS, "--max-concurrency", "1", "4"]) == 0
    plan = json.loads((d / "commands.json").read_text())
    assert plan["engine"] == "torchinferno"
    assert [c["name"] for c in plan["commands"]] == ["latency", "throughput", "server", "serve-c1", "serve-c4"]
    server = plan["commands"][2]["argv"]
    assert server[:4] == ["torchinferno", "serve", "--model-kind", "llama3"] and "{port}" in server
    client = plan["commands"][4]["argv"]
    assert client[:2] == ["torchinferno", "bench-serve"] and client[client.index("--max-concurrency") + 1] == "4"
    # the planned client argv parses with our own CLI (it is what --run executes)
    from torchinferno.cli.main import build_parser

    build_parser().parse_args([a.replace("{port}", "1") for a in client[1:]])
    assert not (d / "latency.json").exists()


def test_run_all_three(tmp_path):
    d = tmp_path / "suite"
    rc = main(["llama-bench-suite", str(d), *ARGS, "--max-concurrency", "2", "--run"])
    status = json.loads((d / "run_status.json").read_text())
    assert rc == 0, status
    assert {k: v["status"] for k, v in status.items()} == {"latency": "ok", "throughput": "ok", "serve-c2": "ok"}
    lat = json.loads((d / "latency.json").read_text())
    assert set(lat) >= {"avg_latency", "latencies", "percentiles"} and len(lat["latencies"]) == 2
    assert set(lat["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
    tp = json.loads((d / "throughput.json").read_text())
    assert tp["num_requests"] == 6 and tp["total_num_tokens"] == 6 * (12 + 6)
    assert math.isclose(tp["tokens_per_second"], tp["total_num_tokens"] / tp["elapsed_time"])
    sv = json.loads((d / "serve-c2.json").read_text())
    assert sv["completed"] == sv["num_prompts"] == 6 and sv["max_concurrency"] == 2 and sv["engine"] == "torchinferno"
    assert all(t <= e for t, e in zip(sv["ttfts"], sv["latencies"]))
    res = load_results([d])
    assert {(r.backend, r.kind) for r in res} == {("torchinferno", k) for k in ("latency", "throughput", "serve")}

    class Count(HTMLParser):
        n = 0

        def handle_starttag(self, tag, attrs):
            Count.n += tag == "svg"

    Count().feed((d / "performance.html").read_text())
    assert Count.n >= 6


def test_multi_device_pipeline_runs_in_stages(tmp_path):
    d = tmp_path / "pp"
    rc = main(["llama-bench-suite", str(d), *ARGS, "--benchmarks", "latency", "--devices", "cpu", "cpu",
               "--parallelism", "pipeline", "--num-iters", "1", "--num-iters-warmup", "0", "--run"])
    status = json.loads((d / "run_status.json").read_text())
    assert rc == 0 and status["latency"]["status"] == "ok"


README_TP_RUN = ["--run", "--parallelism", "tensor", "--benchmarks", "latency", "throughput", "serve", "--input-len", "32",
                 "--output-len", "128", "--batch-size", "8", "--num-prompts", "1000", "--max-concurrency", "256"]
EIGHT = [f"cuda:{i}" for i in range(8)]


def test_default_plan_is_the_readme_llama70b_tp8(tmp_path):
    """`llama-bench-suite DIR --benchmarks latency throughput serve`: planning needs no weights and no GPU."""
    d = tmp_path / "torchinferno-llama70b"
    assert main(["llama-bench-suite", str(d), "--benchmarks", "latency", "throughput", "serve"]) == 0
    plan = json.loads((d / "commands.json").read_text())
    cfg = plan["config"]
    assert cfg["model"] == "meta-llama/Llama-3.3-70B-Instruct" and cfg["tensor_parallel_size"] == 8
    assert cfg["devices"] == EIGHT
    server = next(c for c in plan["commands"] if c["role"] == "server")["argv"]
    assert server[2] == "meta-llama/Llama-3.3-70B-Instruct" and server[server.index("--tensor-parallel-size") + 1] == "8"


def test_readme_pipeline_plan_over_eight_devices(tmp_path):
    d = tmp_path / "pipeline"
    assert main(["llama-bench-suite", str(d), "--devices", *EIGHT, "--parallelism", "pipeline"]) == 0
    plan = json.loads((d / "commands.json").read_text())
    cfg = plan["config"]
    assert cfg["devices"] == EIGHT and cfg["parallelism"] == "pipeline" and cfg["tensor_parallel_size"] == 1
    server = next(c for c in plan["commands"] if c["role"] == "server")["argv"]
    assert server[server.index("--pipeline-parallel-size") + 1] == "8" and "--tensor-parallel-size" not in server


def test_running_a_plan_needing_absent_gpus_is_one_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (README_TP_RUN, ["--run", "--devices", *EIGHT[:2], "--benchmarks", "latency"]):
        d = tmp_path / f"run{len(argv)}"
        assert main(["llama-bench-suite", str(d), *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "0 CUDA device(s) are visible" in err[0], err
    # serve runs against a remote server need no local device
    d = tmp_path / "remote"
    assert main(["llama-bench-suite", str(d), "--benchmarks", "serve", "--base-url", "http://127.0.0.1:9",
                 "--num-prompts", "1", "--run"]) == 1  # the unreachable server fails the run, not the device check
    assert "CUDA device" not in capsys.readouterr().err
