"""``summary.json``, ``performance.csv`` and a self-contained ``performance.html`` from result files.

The HTML has no external assets (inline CSS + inline SVG) so it opens offline and can be mailed
around. Plots: online throughput vs concurrency (and vs request rate), TTFT / TPOT / ITL / E2EL
percentiles per run, per-request latency CDFs, offline throughput and batch latency per backend.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime
from html import escape
from pathlib import Path

from torchinferno.bench import svg
from torchinferno.bench.results import CSV_COLUMNS, ResultFile, effective_concurrency, summary_rows
from torchinferno.bench.stats import fmt_num

__all__ = ["write_report", "render_html", "console_table"]


def _model_short(r: ResultFile) -> str | None:
    m = r.data.get("model_id") or r.data.get("model")
    return str(m).rstrip("/").split("/")[-1] if m else None


def _series_namer(results: list[ResultFile]):
    """Series name per file: the backend, plus the model and the directory when those vary."""
    models = {_model_short(r) for r in results} - {None}
    dirs = {Path(r.path).parent.name for r in results}

    def name(r: ResultFile) -> str:
        bits = [r.backend]
        if len(models) > 1 and _model_short(r):
            bits.append(_model_short(r))
        if len(dirs) > 1:
            bits.append(f"[{Path(r.path).parent.name}]")
        return " ".join(bits)

    return name


def _run_desc(r: ResultFile) -> str:
    d = r.data
    if r.kind != "serve":
        return r.kind
    bits = []
    if d.get("max_concurrency") is not None:
        bits.append(f"c={d['max_concurrency']}")
    rate = d.get("request_rate")
    if rate not in (None, "inf") and not (isinstance(rate, float) and math.isinf(rate)):
        bits.append(f"rate={rate}")
    return " ".join(bits) or r.name


def _serve_plots(serve: list[ResultFile], series_name) -> list[tuple[str, str, str]]:
    """(section title, svg, caption) for the online results."""
    out = []
    names = list(dict.fromkeys(series_name(r) for r in serve))
    conc_series = {b: [] for b in names}
    req_series = {b: [] for b in names}
    rate_series = {b: [] for b in names}
    for r in serve:
        b = series_name(r)
        ot, rt = r.data.get("output_throughput"), r.data.get("request_throughput")
        c = effective_concurrency(r)
        if c is not None:
            conc_series[b].append((c, ot))
            req_series[b].append((c, rt))
        else:
            try:
                rate_series[b].append((float(r.data.get("request_rate")), ot))
            except (TypeError, ValueError):
                pass
    if any(conc_series.values()):
        out.append(("Output throughput vs concurrency",
                    svg.line_chart({b: v for b, v in conc_series.items() if v}, "Output token throughput vs concurrency",
                                   "max concurrency (requests in flight)", "output tokens/s", log_x=True),
                    "Higher is better. Runs without --max-concurrency and an infinite rate count all prompts as in flight."))
        out.append(("Request throughput vs concurrency",
                    svg.line_chart({b: v for b, v in req_series.items() if v}, "Request throughput vs concurrency",
                                   "max concurrency", "requests/s", log_x=True), ""))
    if any(rate_series.values()):
        out.append(("Output throughput vs request rate",
                    svg.line_chart({b: v for b, v in rate_series.items() if v}, "Output token throughput vs request rate",
                                   "request rate (req/s)", "output tokens/s"), ""))
    base = [f"{series_name(r)} {_run_desc(r)}" for r in serve]
    uniq = {id(r): (b if base.count(b) == 1 else f"{b} ({r.name})") for r, b in zip(serve, base)}

    def _label(r):
        return uniq[id(r)]

    labels = [_label(r) for r in serve]
    for metric, title in (("ttft", "Time to first token"), ("tpot", "Time per output token"),
                          ("itl", "Inter-token latency"), ("e2el", "End-to-end latency")):
        stats = {"mean": f"mean_{metric}_ms", "p50": f"median_{metric}_ms"}
        pkeys = sorted({k for r in serve for k in r.data if k.startswith("p") and k.endswith(f"_{metric}_ms")
                        and k[1:].split("_")[0].replace(".", "", 1).isdigit()}, key=lambda k: float(k[1:].split("_")[0]))
        for k in pkeys:
            name = k.split("_")[0]
            if name != "p50":
                stats[name] = k
        series = {}
        for s, key in stats.items():
            vals = [r.data.get(key) if isinstance(r.data.get(key), (int, float)) else None for r in serve]
            if any(v is not None for v in vals):
                series[s] = vals
        if series:
            out.append((f"{title} percentiles",
                        svg.bar_chart(labels, series, f"{title.split(' (')[0]} (ms): mean and percentiles per run", "ms"),
                        "Lower is better. Missing bars: the result file does not carry that statistic."))
    ttft_cdf = {_label(r): [v * 1000 for v in r.per_request("ttfts")] for r in serve}
    e2e_cdf = {_label(r): r.e2e_latencies() for r in serve}
    tpot_cdf = {_label(r): [v * 1000 for v in r.tpots()] for r in serve}
    out.append(("TTFT distribution", svg.cdf_chart(ttft_cdf, "Per-request TTFT (CDF)", "TTFT (ms)"),
                "Each curve is one run; the further left, the faster. Needs per-request data (vLLM: --save-detailed)."))
    out.append(("TPOT distribution", svg.cdf_chart(tpot_cdf, "Per-request TPOT (CDF)", "TPOT (ms)"),
                "TPOT = (e2e - TTFT) / (output_len - 1), recomputed per request."))
    if any(e2e_cdf.values()):
        out.append(("End-to-end latency distribution",
                    svg.cdf_chart(e2e_cdf, "Per-request end-to-end latency (CDF)", "latency (s)"), ""))
    return out


def _offline_plots(tput: list[ResultFile], lat: list[ResultFile], series_name) -> list[tuple[str, str, str]]:
    out = []

    def _label(r):
        same = [x for x in tput + lat if x.kind == r.kind and series_name(x) == series_name(r)]
        return series_name(r) if len(same) == 1 else f"{series_name(r)} ({r.name})"

    if tput:
        labels = [_label(r) for r in tput]
        out.append(("Offline throughput", svg.bar_chart(
            labels, {"tokens/s": [r.data.get("tokens_per_second") for r in tput]},
            "Offline throughput (total tokens/s)", "tokens/s"), "Higher is better (prompt + generated tokens per second)."))
        out.append(("Offline request throughput", svg.bar_chart(
            labels, {"requests/s": [r.data.get("requests_per_second") for r in tput]},
            "Offline throughput (requests/s)", "requests/s"), ""))
    if lat:
        labels = [_label(r) for r in lat]
        series = {"avg": []}
        for p in ("50", "90", "99"):
            series[f"p{p}"] = []
        for r in lat:
            series["avg"].append(r.data.get("avg_latency"))
            pc = r.data.get("percentiles") if isinstance(r.data.get("percentiles"), dict) else {}
            for p in ("50", "90", "99"):
                v = pc.get(p, pc.get(f"{p}.0"))
                series[f"p{p}"].append(v if isinstance(v, (int, float)) else None)
        out.append(("Batch latency", svg.bar_chart(labels, series, "Latency of one batch (s)", "seconds"),
                    "Lower is better: one generate() of --batch-size prompts, --output-len tokens each."))
        out.append(("Batch latency distribution", svg.cdf_chart(
            {_label(r): r.floats("latencies") for r in lat}, "Batch latency over iterations (CDF)", "seconds"), ""))
    return out


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666;font-size:13px} .grid{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0;border:1px solid #e3e3e3;border-radius:6px;padding:6px;background:#fff}
figcaption{font-size:12px;color:#555;max-width:620px;padding:4px}
table{border-collapse:collapse;font-size:12px;margin-top:8px} th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} .bad{color:#b00020} .ok{color:#1b5e20}
"""

_TABLE_COLS = [
    ("backend", "backend"), ("benchmark", "bench"), ("name", "run"), ("model", "model"), ("max_concurrency", "conc"),
    ("request_rate", "rate"), ("completed", "done"), ("output_throughput", "out tok/s"),
    ("request_throughput", "req/s"), ("mean_ttft_ms", "TTFT mean"), ("p99_ttft_ms", "TTFT p99"),
    ("mean_tpot_ms", "TPOT mean"), ("p99_tpot_ms", "TPOT p99"), ("mean_e2el_ms", "E2E mean"),
    ("tokens_per_second", "offline tok/s"), ("requests_per_second", "offline req/s"), ("avg_latency_s", "batch lat s"),
]


def render_html(results: list[ResultFile], title: str = "Benchmark report", run_status: dict | None = None,
                sources: list[str] | None = None) -> str:
    rows = summary_rows(results)
    serve = [r for r in results if r.kind == "serve"]
    tput = [r for r in results if r.kind == "throughput"]
    lat = [r for r in results if r.kind == "latency"]
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{escape(title)}</title>",
         f"<style>{_CSS}</style></head><body>", f"<h1>{escape(title)}</h1>"]
    backends = sorted({r.backend for r in results})
    h.append(f'<div class="meta">generated {datetime.now():%Y-%m-%d %H:%M:%S}; {len(results)} result file(s); '
             f'backends: {escape(", ".join(backends) or "none")}'
             + (f"; sources: {escape(', '.join(sources))}" if sources else "") + "</div>")
    if run_status:
        h.append("<h2>Run status</h2><table><tr><th class=l>benchmark</th><th class=l>status</th><th class=l>detail</th></tr>")
        for name, st in run_status.items():
            if not isinstance(st, dict):
                continue
            s = str(st.get("status", "?"))
            cls = "ok" if s == "ok" else "bad"
            h.append(f"<tr><td class=l>{escape(name)}</td><td class='l {cls}'>{escape(s)}</td>"
                     f"<td class=l>{escape(str(st.get('message', ''))[:300])}</td></tr>")
        h.append("</table>")
    if not results:
        h.append("<p>No result files found: nothing to plot yet.</p>")
    h.append("<h2>Summary</h2><table><tr>" + "".join(
        f"<th class={'l' if k in ('backend', 'benchmark', 'name', 'model') else 'r'}>{escape(t)}</th>" for k, t in _TABLE_COLS) + "</tr>")
    for row in rows:
        h.append("<tr>" + "".join(
            f"<td class={'l' if k in ('backend', 'benchmark', 'name', 'model') else 'r'}>{escape(fmt_num(row.get(k)))}</td>"
            for k, _ in _TABLE_COLS) + "</tr>")
    h.append("</table>")
    sections = []
    namer = _series_namer(results)
    if serve:
        sections.append(("Online serving", _serve_plots(serve, namer)))
    if tput or lat:
        sections.append(("Offline", _offline_plots(tput, lat, namer)))
    for sec_title, plots in sections:
        h.append(f"<h2>{escape(sec_title)}</h2><div class=grid>")
        for name, chart, caption in plots:
            h.append(f'<figure data-plot="{escape(name)}">{chart}'
                     + (f"<figcaption>{escape(caption)}</figcaption>" if caption else "") + "</figure>")
        h.append("</div>")
    h.append("<h2>Files</h2><table><tr><th class=l>file</th><th class=l>kind</th><th class=l>backend</th>"
             "<th class=l>model</th><th class=l>date</th></tr>")
    for r in results:
        h.append(f"<tr><td class=l>{escape(r.path)}</td><td class=l>{r.kind}</td><td class=l>{escape(r.backend)}</td>"
                 f"<td class=l>{escape(str(r.data.get('model_id') or r.data.get('model') or ''))}</td>"
                 f"<td class=l>{escape(str(r.data.get('date', '')))}</td></tr>")
    h.append("</table></body></html>")
    return "\n".join(h)


def console_table(results: list[ResultFile]) -> str:
    """A short fixed-width table for the end of a suite run."""
    rows = summary_rows(results)
    if not rows:
        return "(no results)"
    cols = [("backend", "backend"), ("benchmark", "bench"), ("name", "run"), ("max_concurrency", "conc"),
            ("output_throughput", "out tok/s"), ("mean_ttft_ms", "TTFT ms"), ("p99_ttft_ms", "p99 TTFT"),
            ("mean_tpot_ms", "TPOT ms"), ("tokens_per_second", "offline tok/s"), ("avg_latency_s", "batch s")]
    cells = [[t for _, t in cols]] + [[fmt_num(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report(out_dir: str | Path, results: list[ResultFile], title: str, run_status: dict | None = None,
                 sources: list[str] | None = None) -> dict[str, Path]:
    """Write summary.json, performance.csv, performance.html into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(results)
    summary = {
        "title": title,
        "generated": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backends": sorted({r.backend for r in results}),
        "num_results": len(results),
        "run_status": run_status or {},
        "rows": rows,
    }
    paths = {"summary": out_dir / "summary.json", "csv": out_dir / "performance.csv", "html": out_dir / "performance.html"}
    paths["summary"].write_text(json.dumps(summary, indent=2, default=str))
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
    paths["html"].write_text(render_html(results, title, run_status, sources))
    return paths
