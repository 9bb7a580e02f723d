"""``llama-bench-suite``: vLLM's three benchmarks on TorchInferno's own engine, any family.

* **latency** (``latency.json``, vLLM keys ``avg_latency``, ``std_latency``, ``latencies``,
  ``percentiles``): ``LLM.generate`` of ``--batch-size`` random token-id prompts, ``ignore_eos``,
  timed over ``--num-iters`` after ``--num-iters-warmup`` (prefix caching off, as vLLM does).
* **throughput** (``throughput.json``: ``requests_per_second``, ``tokens_per_second``,
  ``elapsed_time``, ``num_requests``, ``total_num_tokens``): one ``LLM.generate`` of
  ``--num-prompts`` random prompts with continuous batching.
* **serve** (``serve*.json``, ``bench-serve`` keys): a real online run — ``torchinferno serve``
  is started as a subprocess on a free loopback port, ``bench-serve`` sends Poisson / capped
  concurrency traffic to it, the server is stopped.

Every file carries ``"engine": "torchinferno"`` so it plots next to vLLM's results.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

from torchinferno.bench.stats import LATENCY_PERCENTILES
from torchinferno.bench.suite_common import (
    DEFAULT_SUITE_MODEL,
    DEFAULT_SUITE_TP,
    SuiteConfig,
    finish_suite,
    now,
    serve_runs,
    write_json,
)
from torchinferno.errors import ConfigError

__all__ = ["NativeSuiteConfig", "plan_native_suite", "run_native_suite", "latency_bench", "throughput_bench"]

ENGINE = "torchinferno"


@dataclass
class NativeSuiteConfig(SuiteConfig):
    """Without ``model`` and ``model_kind``: the README's plan, ``DEFAULT_SUITE_MODEL`` over ``DEFAULT_SUITE_TP``
    CUDA devices. Otherwise ``devices`` defaults to ``["cpu"]``. Tensor parallelism spans every device."""

    model_kind: str | None = None
    dtype: str = "bfloat16"
    devices: list[str] | None = None
    parallelism: str = "tensor"
    max_num_seqs: int = 64

    def __post_init__(self) -> None:
        readme_plan = self.model is None and self.model_kind is None
        if readme_plan:
            self.model = DEFAULT_SUITE_MODEL
        if self.devices is None:
            self.devices = [f"cuda:{i}" for i in range(DEFAULT_SUITE_TP)] if readme_plan else ["cpu"]
        if self.parallelism == "tensor":
            self.tensor_parallel_size = len(self.devices)

    def validate(self) -> "NativeSuiteConfig":
        super().validate()
        if self.parallelism not in ("tensor", "pipeline"):
            raise ConfigError(f"unknown --parallelism {self.parallelism!r} (valid: pipeline, tensor)")
        if self.model and self.model_kind:
            raise ConfigError("pass either --model or --model-kind, not both")
        if not self.devices:
            raise ConfigError("--devices needs at least one device (e.g. cpu, cuda:0)")
        return self

    @property
    def max_model_len(self) -> int:
        return int(math.ceil((self.input_len + self.output_len + 64) / 16) * 16)

    @property
    def model_desc(self) -> str:
        return f"random:{self.model_kind}" if self.model_kind and not self.model else self.model

    def needs_local_devices(self) -> bool:
        """Whether running the plan puts a model on ``devices`` (not: only serve runs against --base-url)."""
        return bool({"latency", "throughput"} & set(self.benchmarks)) or ("serve" in self.benchmarks and not self.base_url)


def check_devices_present(cfg: NativeSuiteConfig) -> None:
    """One-line ``ConfigError`` when the plan names CUDA devices this host does not have."""
    cuda = [d for d in cfg.devices if d.startswith("cuda")]
    if not cuda or not cfg.needs_local_devices():
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = max(int(d.split(":")[1]) if ":" in d else 0 for d in cuda) + 1
    if need > have:
        raise ConfigError(f"this plan runs {cfg.model_desc} on {len(cfg.devices)} device(s) ({' '.join(cfg.devices)}) "
                          f"but {have} CUDA device(s) are visible here; run it on a host with {need} GPUs, or pass "
                          "--devices cpu with a small --model / --model-kind")


def _server_extra(cfg: NativeSuiteConfig) -> list[str]:
    extra = ["--max-model-len", str(cfg.max_model_len), "--max-num-seqs", str(cfg.max_num_seqs)]
    if len(cfg.devices) > 1:
        extra += [f"--{cfg.parallelism}-parallel-size", str(len(cfg.devices))]
    return extra


def plan_native_suite(cfg: NativeSuiteConfig) -> dict:
    from torchinferno.bench.local_server import torchinferno_serve_argv

    cfg.validate()
    out = Path(cfg.out_dir).resolve()
    common = {"model": cfg.model_desc, "dtype": cfg.dtype, "device": cfg.devices[0], "input_len": cfg.input_len,
              "output_len": cfg.output_len, "seed": cfg.seed}
    cmds: list[dict] = []
    if "latency" in cfg.benchmarks:
        cmds.append({"name": "latency", "benchmark": "latency", "role": "bench", "kind": "in-process",
                     "api": "torchinferno.engine.llm.LLM.generate", "result_file": "latency.json",
                     "params": {**common, "batch_size": cfg.batch_size, "num_iters": cfg.num_iters,
                                "num_iters_warmup": cfg.num_iters_warmup, "enable_prefix_caching": False}})
    if "throughput" in cfg.benchmarks:
        cmds.append({"name": "throughput", "benchmark": "throughput", "role": "bench", "kind": "in-process",
                     "api": "torchinferno.engine.llm.LLM.generate", "result_file": "throughput.json",
                     "params": {**common, "num_prompts": cfg.num_prompts, "max_num_seqs": cfg.max_num_seqs}})
    if "serve" in cfg.benchmarks:
        base = cfg.base_url
        if base is None:
            base = "http://127.0.0.1:{port}"
            cmds.append({"name": "server", "benchmark": "serve", "role": "server", "base_url": base,
                         "argv": torchinferno_serve_argv(cfg.model, cfg.model_kind, 0, cfg.devices[0], cfg.dtype,
                                                         _server_extra(cfg))})
            argv = cmds[-1]["argv"]
            argv[argv.index("--port") + 1] = "{port}"
        for run in serve_runs(cfg):
            argv = ["torchinferno", "bench-serve", "--base-url", base, "--endpoint", cfg.endpoint,
                    "--num-prompts", str(cfg.num_prompts), "--request-rate", run.rate_arg, "--burstiness", "1.0",
                    "--input-len", str(cfg.input_len), "--output-len", str(cfg.output_len), "--seed", str(cfg.seed),
                    "--metric-percentiles", "50,90,99", "--json-output", str(out / f"{run.name}.json")]
            if run.max_concurrency is not None:
                argv += ["--max-concurrency", str(run.max_concurrency)]
            if cfg.ignore_eos:
                argv += ["--ignore-eos"]
            cmds.append({"name": run.name, "benchmark": "serve", "role": "bench", "kind": "online",
                         "result_file": f"{run.name}.json", "argv": argv})
    return {"engine": ENGINE, "created": now(), "config": cfg.as_dict(), "commands": cmds}


# ---------------------------------------------------------------------------------- benchmarks
def _random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    hi = max(2, min(vocab, 10000))  # vLLM's latency bench draws ids below 10000
    return [[rng.randrange(0, hi) for _ in range(length)] for _ in range(n)]


def _build_model(cfg: NativeSuiteConfig):
    from torchinferno.engine.assembly import ModelSpec, build_model

    device = cfg.devices[0]
    if cfg.model_kind and not cfg.model:
        return build_model(ModelSpec(model_kind=cfg.model_kind, dtype=cfg.dtype, device=device)), "byte"
    return build_model(ModelSpec(model=cfg.model, dtype=cfg.dtype, device=device)), None


def _tensor_parallel(cfg: NativeSuiteConfig) -> int:
    """Ranks of a tensor- or pipeline-parallel run: one per device (``cpu`` repeated, or ``cuda:0 .. cuda:N-1``)."""
    n = len(cfg.devices)
    if n == 1:
        return 1
    if cfg.devices not in (["cpu"] * n, [f"cuda:{i}" for i in range(n)]):
        raise ConfigError(f"{cfg.parallelism} parallelism runs rank r on cuda:r (or every rank on cpu); got --devices "
                          f"{' '.join(cfg.devices)} (valid: cuda:0 .. cuda:{n - 1}, or cpu repeated)")
    return n


def _rank_spec(cfg: NativeSuiteConfig):
    """(ModelSpec every worker rank builds its shard of, tokenizer) for a tensor-parallel run."""
    from torchinferno.engine.assembly import ModelSpec

    device = "cpu" if cfg.devices[0] == "cpu" else "cuda"
    if cfg.model_kind and not cfg.model:
        return ModelSpec(model_kind=cfg.model_kind, dtype=cfg.dtype, device=device, prepack=False), "byte"
    return ModelSpec(model=cfg.model, dtype=cfg.dtype, device=device, prepack=False), None


def latency_bench(llm, batch_size: int, input_len: int, output_len: int, num_iters: int, num_iters_warmup: int,
                  seed: int = 0, progress: bool = True) -> dict:
    import numpy as np
    from tqdm import tqdm

    from torchinferno.core.sampling_params import SamplingParams

    vocab = llm.engine.vocab_size or 10000
    prompts = _random_prompts(batch_size, input_len, vocab, seed)
    sp = SamplingParams(max_tokens=output_len, temperature=1.0, top_p=1.0, ignore_eos=True, seed=None)
    for _ in tqdm(range(num_iters_warmup), desc="latency warmup", disable=not progress, leave=False):
        llm.generate(prompts, sp)
    lats = []
    for _ in tqdm(range(num_iters), desc="latency iters", disable=not progress, leave=False):
        t0 = time.perf_counter()
        llm.generate(prompts, sp)
        lats.append(time.perf_counter() - t0)
    arr = np.array(lats)
    return {"avg_latency": float(arr.mean()), "std_latency": float(arr.std()), "latencies": lats,
            "percentiles": {str(p): float(np.percentile(arr, p)) for p in LATENCY_PERCENTILES}}


def throughput_bench(llm, num_prompts: int, input_len: int, output_len: int, seed: int = 0) -> dict:
    from torchinferno.core.sampling_params import SamplingParams

    vocab = llm.engine.vocab_size or 10000
    prompts = _random_prompts(num_prompts, input_len, vocab, seed + 1)
    sp = SamplingParams(max_tokens=output_len, temperature=1.0, top_p=1.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    elapsed = time.perf_counter() - t0
    n_out = sum(len(o.token_ids) for o in outs)
    total = sum(len(p) for p in prompts) + n_out
    return {"elapsed_time": elapsed, "num_requests": num_prompts, "total_num_tokens": total,
            "requests_per_second": num_prompts / elapsed, "tokens_per_second": total / elapsed,
            "total_output_tokens": n_out, "output_tokens_per_second": n_out / elapsed}


def _run_serve_argv(argv: list[str]) -> dict:
    """Execute a planned ``torchinferno bench-serve`` argv in-process; returns the result dict."""
    from torchinferno.bench.serve_args import bench_serve_parser, serve_config_from_args
    from torchinferno.bench.serve_client import run_serve_bench

    a = bench_serve_parser().parse_args(argv[2:])  # argv: torchinferno bench-serve ...
    cfg = serve_config_from_args(a, a.base_url)
    cfg.disable_tqdm = False
    res = run_serve_bench(cfg, log=lambda *_: None)
    Path(a.json_output).write_text(__import__("json").dumps(res, indent=2))
    return res


def _follow_rank0(cfg: NativeSuiteConfig) -> int:
    """A torchrun rank other than 0: run the offline benchmarks in lockstep with rank 0 (each ``LLM`` is this
    rank's ``TorchrunExecutor``; their collectives pair up), writing nothing; rank 0 alone writes the results
    and runs the serve benchmark (its server starts its own workers)."""
    import tempfile
    from dataclasses import replace

    offline = [b for b in cfg.benchmarks if b in ("latency", "throughput")]
    if not offline:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        mine = replace(cfg, out_dir=tmp, benchmarks=offline)
        _, rc = run_native_suite(plan_native_suite(mine), mine, log=lambda *_: None)
    return rc


def run_native_suite(plan: dict, cfg: NativeSuiteConfig, log=print) -> tuple[dict, int]:
    from tqdm import tqdm

    from torchinferno.bench.local_server import LocalServer, free_port

    out = Path(cfg.out_dir)
    status: dict = {}
    benches = [c for c in plan["commands"] if c["role"] == "bench"]
    check_devices_present(cfg)
    extra = {"engine": ENGINE, "model": cfg.model_desc, "dtype": cfg.dtype, "device": cfg.devices[0],
             "input_len": cfg.input_len, "output_len": cfg.output_len}
    offline = [c for c in benches if c["kind"] == "in-process"]
    failed = 0
    if offline:
        from torchinferno.engine.llm import LLM

        t0 = time.perf_counter()
        tp = _tensor_parallel(cfg)
        model, tok = _build_model(cfg) if tp == 1 else _rank_spec(cfg)
        log(f"loaded {cfg.model_desc} on {cfg.devices[0]} in {time.perf_counter() - t0:.1f}s" if tp == 1 else
            f"{cfg.model_desc}: {tp} {cfg.parallelism}-parallel worker ranks on {' '.join(cfg.devices)}")
        ranks = {f"{cfg.parallelism}_parallel_size": tp}
        for c in offline:
            t0 = time.perf_counter()
            try:
                if c["benchmark"] == "latency":
                    llm = LLM(model, tokenizer=tok, max_model_len=cfg.max_model_len, max_num_seqs=cfg.batch_size,
                              enable_prefix_caching=False, **ranks)
                    res = latency_bench(llm, cfg.batch_size, cfg.input_len, cfg.output_len, cfg.num_iters,
                                        cfg.num_iters_warmup, cfg.seed)
                    res.update(extra, batch_size=cfg.batch_size, date=now())
                    log(f"latency: avg {res['avg_latency']:.3f}s over {cfg.num_iters} iters (batch {cfg.batch_size})")
                else:
                    llm = LLM(model, tokenizer=tok, max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                              **ranks)
                    log(f"throughput: {cfg.num_prompts} prompts ...")
                    res = throughput_bench(llm, cfg.num_prompts, cfg.input_len, cfg.output_len, cfg.seed)
                    res.update(extra, date=now())
                    log(f"throughput: {res['requests_per_second']:.2f} req/s, {res['tokens_per_second']:.1f} tok/s")
                if tp > 1:
                    llm.shutdown()
                del llm
                write_json(out / c["result_file"], res)
                status[c["name"]] = {"status": "ok", "seconds": round(time.perf_counter() - t0, 2)}
            except ConfigError as e:
                failed += 1
                status[c["name"]] = {"status": "failed", "message": str(e).splitlines()[0]}
        del model
    online = [c for c in benches if c["kind"] == "online"]
    if online:
        server_cmd = next((c for c in plan["commands"] if c["role"] == "server"), None)
        server = None
        try:
            port = None
            if server_cmd is not None:
                port = free_port()
                argv = [a.replace("{port}", str(port)) for a in server_cmd["argv"]]
                log("starting: " + " ".join(argv))
                server = LocalServer(argv, port, out / "logs" / "server.log")
                try:
                    server.start()
                except ConfigError as e:
                    for c in online:
                        status[c["name"]] = {"status": "failed", "message": str(e)}
                    failed += len(online)
                    online = []
            for c in tqdm(online, desc="serve runs", unit="run", disable=len(online) < 2):
                argv = [a.replace("{port}", str(port)) for a in c["argv"]]
                t0 = time.perf_counter()
                try:
                    res = _run_serve_argv(argv)
                except ConfigError as e:
                    failed += 1
                    status[c["name"]] = {"status": "failed", "message": str(e).splitlines()[0], "argv": argv}
                    continue
                res.update({k: v for k, v in extra.items() if k != "model"})
                res["engine"] = res.get("engine") if res.get("engine") not in (None, "unknown") else ENGINE
                write_json(out / c["result_file"], res)
                ok = res["completed"] == res["num_prompts"]
                failed += 0 if ok else 1
                status[c["name"]] = {"status": "ok" if ok else "failed", "seconds": round(time.perf_counter() - t0, 2),
                                     "argv": argv, "message": "" if ok else
                                     f"{res['num_prompts'] - res['completed']} request(s) failed: "
                                     f"{next((e for e in res['errors'] if e), '')[:200]}"}
                log(f"{c['name']}: {res['completed']}/{res['num_prompts']} ok, {res['output_throughput']:.1f} out tok/s, "
                    f"TTFT p99 {res.get('p99_ttft_ms', float('nan')):.1f} ms")
        finally:
            if server is not None:
                server.stop()
    write_json(out / "run_status.json", status)
    return status, 1 if failed else 0


def native_suite(cfg: NativeSuiteConfig, run: bool, log=print) -> int:
    from torchinferno.engine.torchrun_executor import torchrun_world

    world = torchrun_world()
    if run and world is not None and world[0] != 0:
        return _follow_rank0(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_native_suite(cfg)
    write_json(out / "commands.json", plan)
    log(f"planned {len(plan['commands'])} benchmark step(s) -> {out / 'commands.json'}")
    for c in plan["commands"]:
        log("  " + (" ".join(c["argv"]) if "argv" in c else f"{c['name']}: {c['api']}({c['params']})"))
    if not run:
        return 0
    status, rc = run_native_suite(plan, cfg, log)
    finish_suite(out, "TorchInferno benchmark suite", status, log)
    return rc
