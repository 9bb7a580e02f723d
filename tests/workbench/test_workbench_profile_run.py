"""profile-run artifacts, the standalone repro, and the follow-up commands on the same run."""

import json
import os
import subprocess
import sys

import pytest
import torch

from torchinferno.cli.main import main

ARTIFACTS = ["manifest.json", "run_config.json", "environment.json", "input_ids.json", "output.json", "graph.json",
             "graph.txt", "graph_module.py", "operator_profile.json", "chrome_trace.json", "memory_profile.json", "repro.py"]


def _run_script(path):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINFERNO_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env, cwd=path.parent.parent)


def test_all_artifacts_present_and_valid(llama_run):
    for name in ARTIFACTS:
        assert (llama_run / name).exists(), name
        if name.endswith(".json"):
            json.loads((llama_run / name).read_text())
    manifest = json.loads((llama_run / "manifest.json").read_text())
    assert {a["file"] for a in manifest["artifacts"]} == set(ARTIFACTS) - {"manifest.json"}
    graph = json.loads((llama_run / "graph.json").read_text())
    assert [n["id"] for n in graph["nodes"]] == list(range(graph["num_nodes"]))
    assert graph["max_abs_diff_vs_eager"] == 0.0
    tokens = json.loads((llama_run / "output.json").read_text())["token_ids"]
    assert len(tokens) == 2 and all(len(t) == 4 for t in tokens)
    trace = json.loads((llama_run / "chrome_trace.json").read_text())
    assert trace["traceEvents"] and any(e.get("name") == "generate" for e in trace["traceEvents"])
    ops = json.loads((llama_run / "operator_profile.json").read_text())["operators"]
    assert any(r["name"] == "aten::mm" and r["count"] > 0 for r in ops)
    mem = json.loads((llama_run / "memory_profile.json").read_text())
    assert mem["cpu"]["peak_rss_bytes"] > 0 and mem["weight_bytes"] > 0 and mem["kv_cache_bytes"] > 0


def test_repro_reproduces_tokens_in_a_subprocess(llama_run):
    proc = _run_script(llama_run / "repro.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["match"] and got["token_ids"] == json.loads((llama_run / "output.json").read_text())["token_ids"]


def test_paged_backend_generates_the_same_tokens(llama_run):
    from torchinferno.workbench.run_config import RunConfig, build_model, generate_tokens

    cfg = RunConfig.from_dict(json.loads((llama_run / "run_config.json").read_text()))
    prompts = json.loads((llama_run / "input_ids.json").read_text())["input_ids"]
    cfg.cache_backend = "paged"
    assert generate_tokens(build_model(cfg), prompts, cfg) == json.loads((llama_run / "output.json").read_text())["token_ids"]


def test_profile_nodes_grep(llama_run, capsys):
    assert main(["profile-nodes", str(llama_run), "--grep", "silu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("aten.silu.default" in ln and "mlp" in ln for ln in lines)


def test_profile_subgraph_matches_full_graph_and_repro(llama_run, tmp_path, capsys):
    out = tmp_path / "sub"
    assert main(["profile-subgraph", str(out), "--source-run", str(llama_run), "--nodes", "42:50", "60", "--iters", "2"]) == 0
    spec = json.loads((out / "subgraph_spec.json").read_text())
    assert spec["node_ids"] == [*range(42, 51), 60] and spec["max_abs_diff_vs_source"] <= 1e-6 and spec["ok"]
    assert spec["boundary_inputs"] and spec["outputs"]
    for name in ("manifest.json", "subgraph_graph.json", "subgraph_graph.txt", "operator_profile.json", "chrome_trace.json",
                 "subgraph_tensors.pt", "subgraph_repro.py"):
        assert (out / name).exists(), name
    proc = _run_script(out / "subgraph_repro.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["max_abs_diff"] <= 1e-6


def test_profile_subgraph_invalid_ids_is_one_line(llama_run, tmp_path, capsys):
    n = json.loads((llama_run / "graph.json").read_text())["num_nodes"]
    assert main(["profile-subgraph", str(tmp_path / "bad"), "--source-run", str(llama_run), "--nodes", "5:99999"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: node id 99999 is out of range (valid: 0..{n - 1})"]


def test_profile_region_layer0_attention(llama_run, tmp_path, capsys):
    out = tmp_path / "region"
    assert main(["profile-region", str(out), "--source-run", str(llama_run), "--region", "model.layers.0.self_attn",
                 "--iters", "2"]) == 0
    info = json.loads((out / "region_spec.json").read_text())
    assert info["module_class"] == "Llama3Attention" and info["ok"]
    assert info["graph_max_abs_diff_vs_eager"] <= 1e-6 and info["slice_max_abs_diff_vs_source"] <= 1e-6
    graph = {n["id"]: n for n in json.loads((llama_run / "graph.json").read_text())["nodes"]}
    assert all(graph[i]["module"].startswith("model.layers.0.self_attn") for i in info["full_graph_node_ids"])
    for name in ("operator_profile.json", "chrome_trace.json", "region_graph.json", "region_repro.py"):
        assert (out / name).exists()
    capsys.readouterr()
    assert main(["profile-region", str(tmp_path / "r2"), "--source-run", str(llama_run), "--region", "model.layers.0.self_atn"]) == 1
    err = capsys.readouterr().err
    assert "unknown region 'model.layers.0.self_atn'" in err and "model.layers.0.self_attn" in err and "layers.N.attn" in err
    assert len(err.strip().splitlines()) == 1


def test_profile_pattern_counts_and_numerics(llama_run, tmp_path):
    out = tmp_path / "pattern"
    assert main(["profile-pattern", str(out), "--source-run", str(llama_run), "--pattern", "fused-rmsnorm-swiglu",
                 "--iters", "2"]) == 0
    cmp = json.loads((out / "comparison.json").read_text())
    assert cmp["replaced"] == 2 and cmp["ok"] and cmp["max_abs_error"] <= 1e-5
    assert cmp["op_delta"]["torchinferno.fused_rmsnorm_swiglu.default"] == 2 and cmp["op_delta"]["aten.silu.default"] == -2
    assert cmp["speedup"] > 0 and (out / "pattern_repro.py").exists()


@pytest.mark.parametrize("flags", [["--batch-size", "0"], ["--cache-backend", "dense", "--dtype", "float32", "--device", "tpu"]])
def test_bad_run_flags_are_config_errors(tmp_path, flags, capsys):
    assert main(["profile-run", str(tmp_path / "x"), "--model-kind", "llama3", *flags]) == 1
    assert capsys.readouterr().err.startswith("error: ")
    assert torch.get_num_threads() == 1
