"""Read benchmark result JSON files (vLLM's formats across versions, and ours) into flat rows.

One reader for both backends: a file is classified by its keys, never by its name —

* **serve**: ``vllm bench serve`` / ``benchmark_serving.py`` results (``request_throughput`` or
  ``mean_ttft_ms`` ...) and ``torchinferno bench-serve``;
* **throughput**: ``requests_per_second`` / ``tokens_per_second``;
* **latency**: ``avg_latency`` / ``latencies`` + ``percentiles``.

Every key is optional (older vLLM versions lack ``burstiness``, ``max_concurrency``, ``median_*``,
``e2el`` metrics, ``std_*``, ``failed``, per-request lists ...): a missing value is ``None`` in
the row and simply absent from a plot. The backend (engine) of a file is its ``engine`` key
(TorchInferno writes one), else the ``engine`` of the directory's ``commands.json``, else vllm.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from torchinferno.errors import ConfigError

__all__ = ["ResultFile", "load_results", "load_result_file", "summary_rows", "CSV_COLUMNS", "NON_RESULT_FILES",
           "ResultReadError"]

NON_RESULT_FILES = {"commands.json", "run_status.json", "summary.json", "manifest.json"}


class ResultReadError(ConfigError):
    """A result directory or file cannot be read (missing, not JSON, not a result)."""


@dataclass
class ResultFile:
    kind: str  # latency | throughput | serve
    backend: str  # engine: vllm | torchinferno | ...
    name: str  # file stem
    path: str
    data: dict = field(repr=False)

    # ---- per-request lists (empty when the file does not carry them) --------------------
    def floats(self, key: str) -> list[float]:
        v = self.data.get(key)
        if not isinstance(v, list):
            return []
        return [float(x) for x in v if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]

    def success_mask(self) -> list[bool] | None:
        errs = self.data.get("errors")
        if not isinstance(errs, list):
            return None
        return [not e for e in errs]

    def per_request(self, key: str) -> list[float]:
        """A per-request list restricted to successful requests (when errors are recorded)."""
        vals = self.data.get(key)
        if not isinstance(vals, list):
            return []
        mask = self.success_mask()
        if mask is not None and len(mask) == len(vals):
            vals = [v for v, ok in zip(vals, mask) if ok]
        return [float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]

    def e2e_latencies(self) -> list[float]:
        """Per-request e2e seconds: ``latencies`` when saved (vLLM >= 0.10 / ours), else empty."""
        return self.per_request("latencies")

    def tpots(self) -> list[float]:
        """Per-request TPOT seconds, recomputed as vLLM defines it when the lists are present."""
        lat, ttft, outs = self.data.get("latencies"), self.data.get("ttfts"), self.data.get("output_lens")
        if not (isinstance(lat, list) and isinstance(ttft, list) and isinstance(outs, list)):
            return []
        mask = self.success_mask() or [True] * len(lat)
        out = []
        for e, t, n, ok in zip(lat, ttft, outs, mask):
            if ok and isinstance(n, int) and n > 1 and isinstance(e, (int, float)) and isinstance(t, (int, float)):
                out.append((e - t) / (n - 1))
        return out


def classify(data: dict) -> str | None:
    if not isinstance(data, dict):
        return None
    if any(k in data for k in ("request_throughput", "mean_ttft_ms", "ttfts", "output_throughput")):
        return "serve"
    if "requests_per_second" in data or "tokens_per_second" in data:
        return "throughput"
    if "avg_latency" in data or ("latencies" in data and "percentiles" in data):
        return "latency"
    return None


def _dir_engine(directory: Path) -> str | None:
    cmd = directory / "commands.json"
    if not cmd.is_file():
        return None
    try:
        data = json.loads(cmd.read_text())
    except (OSError, ValueError):
        return None
    return data.get("engine") if isinstance(data, dict) else None


def load_result_file(path: str | Path, default_backend: str = "vllm") -> ResultFile | None:
    """One file -> ``ResultFile``; ``None`` for JSON that is not a benchmark result (e.g. a
    ``*.pytorch.json`` record list); ``ResultReadError`` (one line) for unreadable / corrupt JSON."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ResultReadError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultReadError(f"corrupt JSON in {path}: {e.msg} at line {e.lineno} column {e.colno}") from None
    kind = classify(data)
    if kind is None:
        return None
    backend = data.get("engine") if isinstance(data.get("engine"), str) else default_backend
    return ResultFile(kind, backend, path.stem, str(path), data)


def load_results(dirs: list[str | Path]) -> list[ResultFile]:
    """Every result file in ``dirs`` (non-recursive), sorted by (backend, kind, name)."""
    out: list[ResultFile] = []
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise ResultReadError(f"result directory {d} does not exist")
        if not d.is_dir():
            raise ResultReadError(f"{d} is not a directory")
        default = _dir_engine(d) or "vllm"
        for f in sorted(d.glob("*.json")):
            if f.name in NON_RESULT_FILES or f.name.endswith(".pytorch.json"):
                continue
            r = load_result_file(f, default)
            if r is not None:
                out.append(r)
    out.sort(key=lambda r: (r.backend, r.kind, _sort_key(r)))
    return out


def _num(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _sort_key(r: ResultFile):
    c = _num(r.data.get("max_concurrency"))
    rate = _num(r.data.get("request_rate"))
    return (c if c is not None else math.inf, rate if rate is not None else math.inf, r.name)


def effective_concurrency(r: ResultFile) -> float | None:
    """x-axis of throughput-vs-concurrency: ``max_concurrency``, else all prompts at once when the
    rate is ``inf`` (None for rate-limited runs without a cap)."""
    c = _num(r.data.get("max_concurrency"))
    if c is not None:
        return c
    rate = _num(r.data.get("request_rate"))
    if rate is None or math.isinf(rate):
        return _num(r.data.get("num_prompts"))
    return None


CSV_COLUMNS = [
    "backend", "benchmark", "name", "model", "num_prompts", "request_rate", "burstiness", "max_concurrency",
    "completed", "failed", "duration_s", "request_throughput", "output_throughput", "total_token_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
    "avg_latency_s", "p50_latency_s", "p90_latency_s", "p99_latency_s",
    "requests_per_second", "tokens_per_second", "elapsed_time_s", "num_requests", "total_num_tokens", "file",
]


def _pct(percentiles, p: int):
    if not isinstance(percentiles, dict):
        return None
    for k in (str(p), f"{p}.0", p, float(p)):
        if k in percentiles:
            return _num(percentiles[k])
    return None


def summary_rows(results: list[ResultFile]) -> list[dict]:
    """One flat row per result file with ``CSV_COLUMNS`` (``None`` where the file has no value)."""
    rows = []
    for r in results:
        d = r.data
        row = {c: None for c in CSV_COLUMNS}
        row.update(backend=r.backend, benchmark=r.kind, name=r.name, file=Path(r.path).name,
                   model=d.get("model_id") or d.get("model"))
        if r.kind == "serve":
            row.update(num_prompts=_num(d.get("num_prompts")), request_rate=d.get("request_rate"),
                       burstiness=_num(d.get("burstiness")), max_concurrency=_num(d.get("max_concurrency")),
                       completed=_num(d.get("completed")), failed=_num(d.get("failed")),
                       duration_s=_num(d.get("duration")))
            for k in ("request_throughput", "output_throughput", "total_token_throughput"):
                row[k] = _num(d.get(k))
            if row["total_token_throughput"] is None and row["duration_s"]:
                tot = (_num(d.get("total_input_tokens")) or 0) + (_num(d.get("total_output_tokens")) or 0)
                row["total_token_throughput"] = tot / row["duration_s"] if tot else None
            for m in ("ttft", "tpot", "itl", "e2el"):
                for s in ("mean", "median", "p99"):
                    row[f"{s}_{m}_ms"] = _num(d.get(f"{s}_{m}_ms"))
        elif r.kind == "throughput":
            row.update(requests_per_second=_num(d.get("requests_per_second")),
                       tokens_per_second=_num(d.get("tokens_per_second")),
                       elapsed_time_s=_num(d.get("elapsed_time")), num_requests=_num(d.get("num_requests")),
                       total_num_tokens=_num(d.get("total_num_tokens")))
        else:
            lats = r.floats("latencies")
            avg = _num(d.get("avg_latency"))
            if avg is None and lats:
                avg = sum(lats) / len(lats)
            pc = d.get("percentiles")
            row.update(avg_latency_s=avg, p50_latency_s=_pct(pc, 50), p90_latency_s=_pct(pc, 90),
                       p99_latency_s=_pct(pc, 99))
            if row["p50_latency_s"] is None and lats:
                import numpy as np

                row.update(p50_latency_s=float(np.percentile(lats, 50)), p90_latency_s=float(np.percentile(lats, 90)),
                           p99_latency_s=float(np.percentile(lats, 99)))
        rows.append(row)
    return rows
