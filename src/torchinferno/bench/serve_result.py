"""``bench-serve``'s results: the vLLM-shaped result dict from per-request records, where it is saved, and the
console summary. The client that produces the records is ``bench.serve_client`` (which re-exports these)."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from torchinferno.bench.stats import summarize_ms

if TYPE_CHECKING:
    from torchinferno.bench.serve_client import RequestResult, ServeBenchConfig


def compute_result(cfg: ServeBenchConfig, model: str, outputs: list[RequestResult], duration: float) -> dict:
    """vLLM-shaped result dict (``vllm bench serve --save-result --save-detailed``)."""
    ttfts, tpots, itls, e2els, out_lens = [], [], [], [], []
    total_input = completed = 0
    for o in outputs:
        if o.success:
            n = o.output_tokens
            out_lens.append(n)
            total_input += o.prompt_len
            if n > 1:
                tpots.append((o.latency - o.ttft) / (n - 1))
            itls.extend(o.itl)
            ttfts.append(o.ttft)
            e2els.append(o.latency)
            completed += 1
        else:
            out_lens.append(0)
    total_output = sum(out_lens)
    dur = max(duration, 1e-9)
    res: dict = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": cfg.backend,
        "backend": cfg.backend,
        "label": cfg.label,
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": cfg.num_prompts,
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        "num_warmups": cfg.num_warmups,  # sim.arrival_replay matches a server's step log request by request
        "seed": cfg.seed,  # of the arrival gaps and the prompts: sim.traffic.load_trace draws the same gaps
        "input_len": cfg.input_len,
        "output_len": cfg.output_len,
        "duration": duration,
        "completed": completed,
        "failed": len(outputs) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / dur,
        "request_goodput": None,
        "output_throughput": total_output / dur,
        "total_token_throughput": (total_input + total_output) / dur,
    }
    res.update(summarize_ms("ttft", ttfts, cfg.percentiles))
    res.update(summarize_ms("tpot", tpots, cfg.percentiles))
    res.update(summarize_ms("itl", itls, cfg.percentiles))
    res.update(summarize_ms("e2el", e2els, cfg.percentiles))
    res.update({
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": out_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
    })
    return res


def result_path(cfg: ServeBenchConfig, result: dict, result_dir: str | None, result_filename: str | None,
                json_output: str | None) -> Path | None:
    """Where to save: ``--json-output`` wins; else ``--result-dir``/``--result-filename`` (vLLM naming)."""
    if json_output:
        return Path(json_output)
    if not (result_dir or result_filename):
        return None
    if result_filename:
        name = result_filename
    else:
        conc = f"-concurrency{cfg.max_concurrency}" if cfg.max_concurrency is not None else ""
        base_model = str(result["model_id"]).split("/")[-1]
        name = f"{cfg.label or cfg.backend}-{cfg.request_rate}qps{conc}-{base_model}-{result['date']}.json"
    return Path(result_dir or ".") / name


def format_serve_result(r: dict) -> str:
    """The console summary (vLLM's layout, trimmed)."""
    lines = ["{:=^60}".format(" Serving Benchmark Result ")]

    def row(label, v, fmt="{:.2f}"):
        lines.append("{:<44} {}".format(label, fmt.format(v) if isinstance(v, (int, float)) else v))

    row("Successful requests:", r["completed"], "{}")
    row("Failed requests:", r.get("failed", 0), "{}")
    if r.get("max_concurrency") is not None:
        row("Maximum request concurrency:", r["max_concurrency"], "{}")
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"], "{}")
    row("Total generated tokens:", r["total_output_tokens"], "{}")
    row("Request throughput (req/s):", r["request_throughput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Total token throughput (tok/s):", r["total_token_throughput"])
    for key, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        ps = sorted((k for k in r if k.startswith("p") and k.endswith(f"_{key}_ms")),
                    key=lambda k: float(k[1:].split("_")[0]))
        parts = [f"mean {r[f'mean_{key}_ms']:.2f}", f"median {r[f'median_{key}_ms']:.2f}"]
        parts += [f"{k.split('_')[0].upper()} {r[k]:.2f}" for k in ps]
        row(f"{title} (ms):", ", ".join(parts), "{}")
    errs = [e for e in r.get("errors", []) if e]
    if errs:
        row("First error:", errs[0][:120], "{}")
    lines.append("=" * 60)
    return "\n".join(lines)
