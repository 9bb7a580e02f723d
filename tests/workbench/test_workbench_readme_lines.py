"""The original README's profile command lines, as written, on CPU: defaults (DSv4), artifact names, refusals.

Each workload line is the README's line; where a test appends ``--iters 2`` it only shortens the
timing loop (argparse keeps the last value), every README flag is still given as written.
"""

import json
import os
import subprocess
import sys

from pathlib import Path

import pytest
import torch

import torchinferno
from torchinferno.cli.main import build_parser, main

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")

RUN_ARTIFACTS = ["manifest.json", "run_config.json", "environment.json", "input_ids.json", "output.json", "graph.json",
                 "graph.txt", "graph_module.py", "operator_profile.json", "chrome_trace.json", "memory_profile.json", "repro.py"]
SUBGRAPH_ARTIFACTS = ["source_graph.json", "subgraph_spec.json", "subgraph_graph.json", "subgraph_graph.txt",
                      "subgraph_graph_module.py", "operator_profile.json", "chrome_trace.json", "memory_profile.json",
                      "output.json", "subgraph_repro.py"]
REGION_ARTIFACTS = ["region_spec.json", "region_graph.json", "region_graph.txt", "region_graph_module.py",
                    "operator_profile.json", "chrome_trace.json", "memory_profile.json", "region_repro.py"]
PATTERN_ARTIFACTS = ["reference_graph.json", "optimized_graph.json", "pass_report.json", "reference_profile.json",
                     "optimized_profile.json", "chrome_trace_reference.json", "chrome_trace_optimized.json",
                     "comparison.json", "pattern_repro.py"]


def assert_artifacts(d, names):
    """Every README-listed file exists, parses (JSON / Python) and is in the manifest."""
    listed = {a["file"] for a in json.loads((d / "manifest.json").read_text())["artifacts"]}
    for name in names:
        path = d / name
        assert path.exists(), name
        text = path.read_text()
        if name.endswith(".json"):
            json.loads(text)
        elif name.endswith(".py"):
            compile(text, str(path), "exec")
        assert text.strip(), name
        assert name in listed or name == "manifest.json", name


def _script(path, *args):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINFERNO_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(Path(torchinferno.__file__).resolve().parents[1])  # this checkout, not an installed copy
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The README's CPU block run from one directory: ``.torchinferno_runs/<name>``."""
    root = tmp_path_factory.mktemp("readme") / ".torchinferno_runs"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["profile-run", str(root / "dsv4-cpu"), "--device", "cpu"]) == 0
    finally:
        torch.set_num_threads(n)
    return root


def test_profile_run_defaults_to_dsv4_and_writes_the_readme_artifacts(runs):
    d = runs / "dsv4-cpu"
    assert_artifacts(d, RUN_ARTIFACTS)
    cfg = json.loads((d / "run_config.json").read_text())
    assert cfg["model_kind"] == "dsv4" and cfg["model"] is None and cfg["device"] == "cpu"
    mem = json.loads((d / "memory_profile.json").read_text())
    assert "cuda" not in mem and "RSS" in mem["measured"] and mem["cpu"]["peak_rss_bytes"] > 0


def test_profile_nodes_grep_embedding(runs, capsys):
    assert main(["profile-nodes", str(runs / "dsv4-cpu"), "--grep", "embedding"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "aten.embedding.default" in lines[0] and "model.embed_tokens" in lines[0]


def test_profile_subgraph_readme_line(runs):
    out = runs / "subgraph-cpu"
    assert main(["profile-subgraph", str(out), "--source-run", str(runs / "dsv4-cpu"), "--nodes", "3", "--device", "cpu",
                 "--iters", "2"]) == 0
    assert_artifacts(out, SUBGRAPH_ARTIFACTS)
    src = json.loads((out / "source_graph.json").read_text())
    assert src["signature"] == json.loads((runs / "dsv4-cpu" / "graph.json").read_text())["signature"]
    outs = json.loads((out / "output.json").read_text())
    assert outs["ok"] and outs["outputs"][0]["shape"] == [8, 64]


def test_profile_region_readme_line_defaults_to_dsv4(runs):
    out = runs / "attn0-cpu"
    assert main(["profile-region", str(out), "--region", "layers.0.attn", "--device", "cpu", "--iters", "2"]) == 0
    assert_artifacts(out, REGION_ARTIFACTS)
    spec = json.loads((out / "region_spec.json").read_text())
    assert spec["module_path"] == "model.layers.0.self_attn" and spec["module_class"] == "LatentAttention" and spec["ok"]


def test_profile_region_tokens_and_moe_layer(tmp_path):
    out = tmp_path / "moe"
    assert main(["profile-region", str(out), "--model-kind", "dsv4", "--region", "layers.1.moe", "--tokens", "4",
                 "--iters", "2"]) == 0
    spec = json.loads((out / "region_spec.json").read_text())
    assert spec["module_class"] == "SparseMoE" and spec["input_shapes"][0][0] == 4 and spec["iters"] == 2 and spec["ok"]


def test_profile_pattern_readme_line_defaults(runs):
    out = runs / "swiglu-pattern-cpu"
    assert main(["profile-pattern", str(out), "--device", "cpu", "--iters", "2"]) == 0
    assert_artifacts(out, PATTERN_ARTIFACTS)
    cmp = json.loads((out / "comparison.json").read_text())
    assert cmp["pattern"] == "fused-rmsnorm-swiglu" and cmp["replaced"] == 1 and cmp["ok"]  # DSv4's dense layer 0
    report = json.loads((out / "pass_report.json").read_text())
    assert report["replaced"] == 1 and report["instances_tried"] and report["matches"][0]["matched_ids"]


def test_profile_pattern_standalone_at_a_shape(tmp_path):
    out = tmp_path / "syn"
    assert main(["profile-pattern", str(out), "--pattern", "fused-rmsnorm-swiglu", "--device", "cpu", "--hidden-size", "64",
                 "--tokens", "16", "--iters", "2"]) == 0
    assert_artifacts(out, PATTERN_ARTIFACTS)
    cmp = json.loads((out / "comparison.json").read_text())
    assert cmp["replaced"] == 1 and cmp["ok"] and "T=16, H=64" in cmp["workload"]
    assert cmp["op_delta"]["torchinferno.fused_rmsnorm_swiglu.default"] == 1
    ref = json.loads((out / "reference_graph.json").read_text())
    assert ref["nodes"][0]["shapes"] == [[16, 64]]
    proc = _script(out / "pattern_repro.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ok"]


def test_profile_pattern_standalone_refuses_model_flags(tmp_path, capsys):
    assert main(["profile-pattern", str(tmp_path / "x"), "--hidden-size", "64", "--model-kind", "llama3"]) == 1
    assert "standalone" in capsys.readouterr().err


def test_deepseek_paged_profile_run_on_cpu(tmp_path):
    d = tmp_path / "deepseek-paged"
    assert main(["profile-run", str(d), "--model-kind", "deepseek", "--device", "cpu", "--cache-backend", "paged",
                 "--prompt-tokens", "4", "--new-tokens", "2", "--no-graph"]) == 0
    cfg = json.loads((d / "run_config.json").read_text())
    assert cfg["model_kind"] == "deepseek" and cfg["cache_backend"] == "paged"


def test_model_kind_and_model_stay_mutually_exclusive():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["profile-run", "d", "--model-kind", "dsv4", "--model", "x"])


GPU_LINES = [
    ["profile-run", "{d}", "--model-kind", "dsv4", "--device", "cuda", "--batch-size", "1", "--prompt-tokens", "8",
     "--new-tokens", "8"],
    ["profile-region", "{d}", "--model-kind", "dsv4", "--region", "layers.0.attn", "--device", "cuda", "--tokens", "8",
     "--iters", "20"],
    ["profile-pattern", "{d}", "--pattern", "fused-rmsnorm-swiglu", "--device", "cuda", "--hidden-size", "4096",
     "--tokens", "16", "--iters", "50"],
    ["profile-subgraph", "{d}", "--source-run", "{run}", "--nodes", "42:50", "--device", "cuda", "--iters", "50"],
    ["profile-run", "{d}", "--model-kind", "deepseek", "--device", "cuda", "--cache-backend", "paged"],
    ["trace-smoke", "--device", "cuda"],
]


@NO_CUDA
@pytest.mark.parametrize("line", GPU_LINES, ids=lambda line: line[0] + "-" + "-".join(line[-2:]))
def test_gpu_lines_parse_and_refuse_in_one_line(line, runs, tmp_path, capsys):
    argv = [a.format(d=tmp_path / "gpu", run=runs / "dsv4-cpu") for a in line]
    build_parser().parse_args(argv)  # the README's flags all exist
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --device cuda requested but CUDA is not available (valid here: cpu)"]
    assert not (tmp_path / "gpu" / "manifest.json").exists()


@NO_CUDA
def test_repro_scripts_refuse_cuda_in_one_line(runs):
    scripts = [runs / "dsv4-cpu" / "repro.py", runs / "subgraph-cpu" / "subgraph_repro.py",
               runs / "attn0-cpu" / "region_repro.py", runs / "swiglu-pattern-cpu" / "pattern_repro.py"]
    for path in scripts:
        if not path.exists():
            pytest.skip(f"{path.name}: its README test did not run first")
        proc = _script(path, "--device", "cuda")
        assert proc.returncode == 1, (path.name, proc.stdout[-500:])
        assert proc.stderr.strip().splitlines() == ["error: --device cuda requested but CUDA is not available (valid here: cpu)"]
        assert not proc.stdout.strip()


def test_graph_repro_runs_on_the_recorded_device_and_on_cpu_explicitly(runs):
    path = runs / "subgraph-cpu" / "subgraph_repro.py"
    if not path.exists():
        pytest.skip("the subgraph README test did not run first")
    for args in ((), ("--device", "cpu", "--iters", "2")):
        proc = _script(path, *args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["ok"] and got["device"] == "cpu"
