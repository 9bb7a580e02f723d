"""A model's KV layout through the simulation commands (issue 21): ``--model-kind`` / ``--kv-spec-from`` size each
replica's pools with the engine's planner (``sim.kv_capacity.simulated_kv_plan``), so a deepseek-v4 replica gets its
sliding-window pool and holds far more long sequences than the same memory as one whole-context pool."""

import json

import torch

from torchinferno.cli.main import main
from torchinferno.engine.config import EngineConfig
from torchinferno.models.registry import get_family
from torchinferno.sim.kv_capacity import simulated_kv_plan

MEM = 20 * 2**30
# 48 prompts of 4096 tokens at once on one replica: a whole-context pool of V4-flash's full bytes per token holds 21
LONG = ["--requests", "48", "--rate", "inf", "--input-len", "4096", "--output-len", "64", "--max-model-len", "8192",
        "--gpus", "1", "--kv-cache-memory", "20GiB"]
V4 = ["--model-kind", "deepseek-v4", "--size", "deepseek-v4-flash"]


def _smoke(tmp_path, name, *args) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["sim-smoke", *args, "--json-output", str(out)]) == 0
    return json.loads(out.read_text())["colocated"]


def test_v4_pools_admit_more_long_requests_than_one_whole_pool(tmp_path, capsys):
    spec = get_family("deepseek-v4").kv_spec(get_family("deepseek-v4").size("deepseek-v4-flash"))
    hybrid = _smoke(tmp_path, "v4", *LONG, *V4)
    whole = _smoke(tmp_path, "whole", *LONG, "--kv-bytes-per-token", str(spec.bytes_per_token(torch.bfloat16)))
    text = capsys.readouterr().out
    assert "sliding blocks (window 128) of deepseek-v4/deepseek-v4-flash" in text
    # the engine's own plan for this memory (the default calibration is a CUDA one: CUDA step limits)
    cfg = EngineConfig(block_size=16, max_model_len=8192, kv_cache_memory=MEM).for_device("cuda")
    plan = simulated_kv_plan(spec, torch.bfloat16, cfg, 8192)
    kv = hybrid["kv"]
    assert (kv["num_blocks"], kv["num_sliding_blocks"], kv["sliding_window"]) == \
        (plan.num_blocks, plan.num_sliding_blocks, 128)
    assert whole["kv"]["num_blocks"] == MEM // (spec.bytes_per_token(torch.bfloat16) * 16)
    assert whole["kv"]["num_sliding_blocks"] is None
    assert hybrid["completed"] == whole["completed"] == 48
    # the point of the sliding pool: every prompt runs at once, where the whole-context pool holds blocks x 16 / 4160 of them
    assert whole["kv"]["max_batch_seqs"] <= whole["kv"]["num_blocks"] * 16 // 4160 + 1
    assert hybrid["kv"]["max_batch_seqs"] == 48 > 2 * whole["kv"]["max_batch_seqs"]


def test_kv_spec_from_config_equals_model_kind(tmp_path):
    fam = get_family("deepseek-v4")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(fam.config_to_hf(fam.size("deepseek-v4-flash"))))
    args = ["--requests", "8", "--input-len", "512", "--output-len", "8", "--gpus", "1", "--kv-cache-memory", "8GiB"]
    a = _smoke(tmp_path, "kind", *args, *V4)["kv"]
    b = _smoke(tmp_path, "cfg", *args, "--kv-spec-from", str(tmp_path))["kv"]
    assert {k: v for k, v in a.items() if k != "model"} == {k: v for k, v in b.items() if k != "model"}


def test_default_runs_unchanged(tmp_path):
    """No KV flags: the summary has no ``kv`` entry (same JSON as before); a one-group spec (llama) at the same
    block count gives the same figures."""
    base = ["--requests", "24", "--gpus", "1"]
    plain = _smoke(tmp_path, "plain", *base)
    assert "kv" not in plain
    llama = _smoke(tmp_path, "llama", *base, "--model-kind", "llama3", "--size", "llama3-8b")
    assert llama.pop("kv")["num_blocks"] == 4096
    assert llama == plain


def test_plan_and_traffic_report_pools(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["sim-plan", "--requests", "16", "--rate", "50", "--max-gpus", "1", "--tp-sizes", "1", *V4,
                 "--kv-cache-memory", "8GiB", "--json-output", str(out)]) == 0
    best = json.loads(out.read_text())["best"]
    assert best["kv"]["num_sliding_blocks"] > 0
    assert main(["traffic-smoke", "--requests", "8", "--gpus", "1", *V4, "--kv-cache-memory", "8GiB"]) == 0
    assert "sliding blocks (window 128)" in capsys.readouterr().out


def test_bad_kv_flags_are_one_line_errors(tmp_path, capsys):
    cases = [
        (["--model-kind", "deepseek-v9"], "valid: deepseek"),
        ([*V4[:2], "--size", "huge"], "valid: debug, deepseek-v4-flash, small"),
        (["--kv-cache-memory", "lots"], "cannot parse memory size"),
        ([*V4, "--kv-bytes-per-token", "100"], "give one"),
        ([*V4, "--kv-spec-from", str(tmp_path)], "not both"),
        (["--kv-spec-from", str(tmp_path / "missing.json")], "cannot read a config.json"),
    ]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_type": "gpt2"}))
    cases.append((["--kv-spec-from", str(bad)], "supported: "))
    for args, msg in cases:
        assert main(["sim-smoke", "--requests", "4", *args]) == 1, args
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, (args, err)


def test_validate_mirrors_the_real_hybrid_pools(tmp_path):
    """sim-validate on a tiny deepseek-v4: the simulated replica has the real engine's sliding pool too."""
    from torchinferno.sim.calibration import Calibration
    from torchinferno.sim.cost_model import CostModel

    cal = tmp_path / "cal.json"
    Calibration(cost=CostModel.per_token(1e-5, 1e-4), device="cpu").save(cal)
    v = tmp_path / "v.json"
    assert main(["sim-validate", "--model-kind", "deepseek-v4", "--dtype", "float32", "--threads", "1",
                 "--max-model-len", "64", "--block-size", "4", "--calibration", str(cal), "--concurrency", "2",
                 "--requests", "2", "--input-len", "12", "--output-len", "4", "--json-output", str(v)]) == 0
    res = json.loads(v.read_text())
    real, sim = res["engine"], res["simulated_engine"]
    sliding = real[real.index("+ "):].split(" sliding-window blocks")[0]
    assert sliding[2:].isdigit() and f"{sliding} sliding-window blocks (window " in sim


def test_served_validation_keeps_the_logged_sliding_pool(tmp_path):
    """A served V4 engine's step log records its sliding pool; sim-calibrate --from-step-log keeps it in the engine
    limits and the served validation's replica gets it (a simulated V4 core stands in for the served engine)."""
    from torchinferno.engine.core import EngineCore
    from torchinferno.engine.step_log import StepLog, step_log_meta
    from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
    from torchinferno.sim.cost_model import CostModel
    from torchinferno.sim.driver import Replica, run_workload
    from torchinferno.sim.executor import SimulatedExecutor
    from torchinferno.sim.step_log_fit import calibration_from_step_logs
    from torchinferno.sim.traffic import TrafficSpec, generate
    from torchinferno.sim.validate import served_run

    spec = get_family("deepseek-v4").kv_spec(tiny_deepseek_v4_config())
    ex = SimulatedExecutor(CostModel(c0=1e-3, coef={"prefill_tokens": 1e-5}),
                           EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, block_size=4, max_model_len=64),
                           kv_spec=spec, kv_dtype=torch.float32, kv_cache_memory=2**20)
    core = EngineCore(ex)
    core.record_shapes = True
    path = tmp_path / "steps.jsonl"
    log = StepLog(str(path), step_log_meta(core))
    rep = Replica(core, ex.clock, "r")

    def hook(t0, t1):
        log.record(t0, t1, core.last_shape, 0, 0.0, core.last_launched, core.last_resolved)
        core.last_shape = None

    rep.step_hook = hook
    reqs = generate(TrafficSpec(num_requests=24, prompt_len="uniform:8:40", output_len="uniform:2:16", seed=1))
    run_workload(reqs, [rep], max_concurrency=8)
    log.close()
    cal = calibration_from_step_logs([str(path)], log=lambda *_: None)
    cal.device = "cpu"  # a simulated executor logs no device
    limits = cal.extra["engine_limits"]
    assert (limits["num_sliding_blocks"], limits["sliding_window"]) == (ex.num_sliding_blocks, 8)
    seen = []
    served_run(cal, {"max_concurrency": 8}, reqs, cost_model="linear", replica_hook=lambda r: seen.append(r.core))
    assert seen[0].sliding_pool.num_blocks == ex.num_sliding_blocks
