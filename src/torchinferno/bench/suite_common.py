"""What the vLLM suite and TorchInferno's own suite share: config, run naming, status, reporting.

A suite directory holds ``commands.json`` (the plan), ``run_status.json`` (what happened to each
benchmark), the result JSON files (vLLM's shapes: ``latency.json``, ``throughput.json``,
``serve*.json``), ``logs/`` and the report (``summary.json``, ``performance.csv``,
``performance.html``).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from torchinferno.errors import ConfigError

__all__ = ["SuiteConfig", "ServeRun", "serve_runs", "write_json", "finish_suite", "BENCHMARKS", "DEFAULT_SUITE_MODEL",
           "DEFAULT_SUITE_TP"]

BENCHMARKS = ("latency", "throughput", "serve")
# The README's comparison plan: both suites default to Llama 3.3 70B Instruct on 8-way tensor parallelism.
DEFAULT_SUITE_MODEL = "meta-llama/Llama-3.3-70B-Instruct"
DEFAULT_SUITE_TP = 8


@dataclass
class SuiteConfig:
    out_dir: str
    benchmarks: list[str] = field(default_factory=lambda: list(BENCHMARKS))
    model: str | None = None
    input_len: int = 128
    output_len: int = 128
    batch_size: int = 8
    num_prompts: int = 100
    request_rates: list[float] = field(default_factory=lambda: [math.inf])
    max_concurrency: list[int | None] = field(default_factory=lambda: [None])
    num_iters: int = 10
    num_iters_warmup: int = 3
    seed: int = 0
    base_url: str | None = None
    endpoint: str = "/v1/completions"
    ignore_eos: bool = True
    tensor_parallel_size: int = 1

    def validate(self) -> "SuiteConfig":
        bad = [b for b in self.benchmarks if b not in BENCHMARKS]
        if bad or not self.benchmarks:
            raise ConfigError(f"unknown benchmark {bad[0] if bad else '(none)'!r} (valid: {', '.join(BENCHMARKS)})")
        for name in ("input_len", "output_len", "batch_size", "num_prompts", "num_iters", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.num_iters_warmup < 0:
            raise ConfigError(f"--num-iters-warmup must be >= 0, got {self.num_iters_warmup}")
        if any(not r > 0 for r in self.request_rates):
            raise ConfigError(f"--request-rate values must be > 0 or inf, got {self.request_rates}")
        if any(c is not None and c < 1 for c in self.max_concurrency):
            raise ConfigError(f"--max-concurrency values must be >= 1, got {self.max_concurrency}")
        return self

    def as_dict(self) -> dict:
        d = asdict(self)
        d["request_rates"] = ["inf" if math.isinf(r) else r for r in self.request_rates]
        return d


@dataclass
class ServeRun:
    name: str
    request_rate: float
    max_concurrency: int | None

    @property
    def rate_arg(self) -> str:
        return "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"


def serve_runs(cfg: SuiteConfig) -> list[ServeRun]:
    """One serve run per (rate, concurrency); names stay short and unique (``serve-c16``)."""
    combos = list(itertools.product(cfg.request_rates, cfg.max_concurrency))
    out = []
    for rate, conc in combos:
        bits = []
        if len(set(cfg.request_rates)) > 1 or not math.isinf(rate):
            bits.append(f"r{'inf' if math.isinf(rate) else f'{rate:g}'}")
        if conc is not None:
            bits.append(f"c{conc}")
        out.append(ServeRun("-".join(["serve", *bits]) if bits else "serve", rate, conc))
    return out


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def now() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def finish_suite(out_dir: Path, title: str, run_status: dict | None, log=print) -> None:
    """Write the report files from whatever results the directory holds, then print the table."""
    from torchinferno.bench.report import console_table, write_report
    from torchinferno.bench.results import load_results

    results = load_results([out_dir])
    paths = write_report(out_dir, results, title, run_status)
    log(console_table(results))
    log(f"report: {paths['html']} (+ {paths['csv'].name}, {paths['summary'].name})")
