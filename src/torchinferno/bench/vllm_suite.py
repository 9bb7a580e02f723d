"""``vllm-bench-suite``: plan (and optionally run) ``vllm bench latency|throughput|serve``.

The plan is exact argv lists, checked against ``vllm_flags`` (vLLM 0.11.x) before they are
written, so ``commands.json`` can be copied to a GPU host and executed as is. Serve benchmarks
need a server: ``--base-url`` points at a running one; without it the plan adds a
``vllm serve MODEL`` entry that ``--run`` starts on ``--port`` and stops afterwards.

Result files use vLLM's own flags: ``--output-json DIR/latency.json``, ``--output-json
DIR/throughput.json``, ``--save-result --save-detailed --result-dir DIR --result-filename
serve-*.json`` (detailed = per-request lists, which the report's distribution plots need).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from pathlib import Path

from torchinferno.bench.suite_common import DEFAULT_SUITE_MODEL, SuiteConfig, finish_suite, now, serve_runs, write_json
from torchinferno.bench.vllm_flags import VLLM_VERSION_BASIS, check_argv

__all__ = ["plan_vllm_suite", "run_vllm_suite", "NOT_INSTALLED"]

NOT_INSTALLED = "not installed"


def plan_vllm_suite(cfg: SuiteConfig, port: int = 8000) -> dict:
    """The plan as a JSON-able dict (``commands.json``); every argv is validated."""
    cfg.validate()
    out = Path(cfg.out_dir).resolve()
    model = cfg.model or DEFAULT_SUITE_MODEL
    tp = str(cfg.tensor_parallel_size)
    cmds: list[dict] = []
    if "latency" in cfg.benchmarks:
        cmds.append({"name": "latency", "benchmark": "latency", "role": "bench", "result_file": "latency.json", "argv": [
            "vllm", "bench", "latency", "--model", model, "--tensor-parallel-size", tp,
            "--input-len", str(cfg.input_len), "--output-len", str(cfg.output_len), "--batch-size", str(cfg.batch_size),
            "--num-iters-warmup", str(cfg.num_iters_warmup), "--num-iters", str(cfg.num_iters),
            "--seed", str(cfg.seed), "--output-json", str(out / "latency.json")]})
    if "throughput" in cfg.benchmarks:
        cmds.append({"name": "throughput", "benchmark": "throughput", "role": "bench", "result_file": "throughput.json",
                     "argv": [
            "vllm", "bench", "throughput", "--model", model, "--tensor-parallel-size", tp, "--backend", "vllm",
            "--dataset-name", "random", "--input-len", str(cfg.input_len), "--output-len", str(cfg.output_len),
            "--num-prompts", str(cfg.num_prompts), "--seed", str(cfg.seed), "--output-json", str(out / "throughput.json")]})
    if "serve" in cfg.benchmarks:
        base_url = cfg.base_url
        if base_url is None:
            base_url = f"http://127.0.0.1:{port}"
            cmds.append({"name": "server", "benchmark": "serve", "role": "server", "base_url": base_url, "argv": [
                "vllm", "serve", model, "--tensor-parallel-size", tp, "--host", "127.0.0.1", "--port", str(port),
                "--max-model-len", str(_round_up(cfg.input_len + cfg.output_len + 64, 256)), "--seed", str(cfg.seed)]})
        backend = "openai-chat" if cfg.endpoint.endswith("chat/completions") else "vllm"
        for run in serve_runs(cfg):
            argv = ["vllm", "bench", "serve", "--backend", backend, "--base-url", base_url.rstrip("/"),
                    "--endpoint", cfg.endpoint, "--model", model, "--dataset-name", "random",
                    "--random-input-len", str(cfg.input_len), "--random-output-len", str(cfg.output_len),
                    "--num-prompts", str(cfg.num_prompts), "--request-rate", run.rate_arg, "--burstiness", "1.0"]
            if run.max_concurrency is not None:
                argv += ["--max-concurrency", str(run.max_concurrency)]
            if cfg.ignore_eos:
                argv += ["--ignore-eos"]
            argv += ["--seed", str(cfg.seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
                     "50,90,99", "--save-result", "--save-detailed", "--result-dir", str(out),
                     "--result-filename", f"{run.name}.json"]
            cmds.append({"name": run.name, "benchmark": "serve", "role": "bench", "result_file": f"{run.name}.json",
                         "argv": argv})
    for c in cmds:
        check_argv(c["argv"])
    return {"engine": "vllm", "created": now(), "vllm_version_basis": VLLM_VERSION_BASIS,
            "config": cfg.as_dict(), "commands": cmds}


def _round_up(n: int, m: int) -> int:
    return int(math.ceil(n / m) * m)


def find_vllm(executable: str | None = None) -> str | None:
    return shutil.which(executable or "vllm")


def run_vllm_suite(plan: dict, out_dir: Path, executable: str | None = None, log=print,
                   startup_timeout_s: float = 900.0) -> tuple[dict, int]:
    """Execute a plan; returns (run_status, exit code). vLLM absent -> every benchmark "not installed"."""
    from tqdm import tqdm

    from torchinferno.bench.local_server import LocalServer
    from torchinferno.errors import ConfigError

    benches = [c for c in plan["commands"] if c["role"] == "bench"]
    exe = find_vllm(executable)
    status: dict = {}
    if exe is None:
        msg = (f"vLLM is not installed here (no `{executable or 'vllm'}` executable on PATH); "
               "run commands.json on a host with vLLM, or use `torchinferno llama-bench-suite` for TorchInferno's engine")
        for c in benches:
            status[c["name"]] = {"status": NOT_INSTALLED, "message": msg, "argv": c["argv"]}
        write_json(out_dir / "run_status.json", status)
        log(f"vllm-bench-suite: {msg}")
        return status, 3
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server_cmd = next((c for c in plan["commands"] if c["role"] == "server"), None)
    server = None
    server_error = None
    failed = 0
    try:
        for c in tqdm(benches, desc="vllm bench", unit="bench"):
            if c["benchmark"] == "serve" and server_cmd is not None:
                if server is None and server_error is None:
                    port = int(server_cmd["argv"][server_cmd["argv"].index("--port") + 1])
                    server = LocalServer([exe, *server_cmd["argv"][1:]], port, logs / "server.log", startup_timeout_s)
                    try:
                        server.start()
                    except ConfigError as e:
                        server, server_error = None, f"vllm serve did not start: {e}"
                if server_error is not None:
                    status[c["name"]] = {"status": "failed", "message": server_error, "argv": c["argv"]}
                    failed += 1
                    continue
            t0 = time.perf_counter()
            log_path = logs / f"{c['name']}.log"
            with open(log_path, "w") as lf:
                rc = subprocess.call([exe, *c["argv"][1:]], stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            dt = time.perf_counter() - t0
            ok = rc == 0 and (out_dir / c["result_file"]).is_file()
            tail = ""
            if not ok:
                lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
                tail = lines[-1][:300] if lines else ""
                failed += 1
            status[c["name"]] = {"status": "ok" if ok else "failed", "returncode": rc, "seconds": round(dt, 2),
                                 "message": "" if ok else (tail or f"exit code {rc}, no result file"),
                                 "log": str(log_path), "argv": c["argv"]}
    finally:
        if server is not None:
            server.stop()
    write_json(out_dir / "run_status.json", status)
    return status, 1 if failed else 0


def vllm_suite(cfg: SuiteConfig, run: bool, port: int = 8000, executable: str | None = None, log=print) -> int:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_vllm_suite(cfg, port)
    write_json(out / "commands.json", plan)
    log(f"planned {len(plan['commands'])} command(s) for {VLLM_VERSION_BASIS.split(' (')[0]} -> {out / 'commands.json'}")
    for c in plan["commands"]:
        log("  " + " ".join(c["argv"]))
    if not run:
        return 0
    status, rc = run_vllm_suite(plan, out, executable, log)
    finish_suite(out, "vLLM benchmark suite", status, log)
    return rc
