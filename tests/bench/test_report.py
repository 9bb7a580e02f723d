"""Result reader + report: vLLM result files of several versions (missing keys) and ours, one reader."""

import csv
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from torchinferno.bench.report import render_html
from torchinferno.bench.results import load_results, summary_rows
from torchinferno.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures"

VERSIONS = ["vllm_v0_4", "vllm_v0_6", "vllm_v0_11"]


class _Svgs(HTMLParser):
    """Counts <svg> charts and the data marks inside them; collects figure names."""

    def __init__(self):
        super().__init__()
        self.svgs = self.marks = 0
        self.figures, self.tables = [], 0
        self._in_svg = 0

    def handle_starttag(self, tag, attrs):
        if tag == "svg":
            self.svgs += 1
            self._in_svg += 1
        elif self._in_svg and tag in ("polyline", "circle", "rect"):
            self.marks += 1
        elif tag == "figure":
            self.figures.append(dict(attrs).get("data-plot"))
        elif tag == "table":
            self.tables += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self._in_svg -= 1


def _parse(html: str) -> _Svgs:
    p = _Svgs()
    p.feed(html)
    p.close()
    return p


def test_reader_tolerates_old_vllm_formats():
    res = load_results([FIXTURES / v for v in VERSIONS])
    kinds = sorted((r.kind, r.name) for r in res)
    assert ("latency", "latency.pytorch") not in kinds  # the PyTorch-format side file is not a result
    assert len(res) == 10
    assert {r.backend for r in res} == {"vllm"}
    rows = summary_rows(res)
    old = next(r for r in rows if r["file"].startswith("vllm-infqps"))
    assert old["request_rate"] == float("inf") and old["max_concurrency"] is None and old["mean_e2el_ms"] is None
    assert old["total_token_throughput"] == pytest.approx((768 + 96) / 0.6)  # derived when the key is missing
    lat_rows = [r for r in rows if r["benchmark"] == "latency"]
    assert {round(r["p99_latency_s"], 4) for r in lat_rows} == {1.5491, 0.9198}
    v011 = next(r for r in res if r.name == "serve-c8" and "v0_11" in r.path)
    assert len(v011.tpots()) == 8 and len(v011.per_request("ttfts")) == 8


def test_fixtures_plot_without_error(tmp_path):
    rc = main(["vllm-bench-plot", *[str(FIXTURES / v) for v in VERSIONS], "--output-dir", str(tmp_path)])
    assert rc == 0
    p = _parse((tmp_path / "performance.html").read_text())
    assert p.svgs >= 8 and p.marks > 50
    for name in ("Output throughput vs concurrency", "Time to first token percentiles", "Time per output token percentiles",
                 "TTFT distribution", "Offline throughput", "Batch latency"):
        assert name in p.figures, name
    rows = list(csv.DictReader(open(tmp_path / "performance.csv")))
    assert len(rows) == 10 and rows[0]["backend"] == "vllm"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_results"] == 10


def test_own_suite_files_use_the_same_reader(tmp_path):
    """A llama-bench-suite-shaped directory next to vLLM's: one report, a backend column."""
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "latency.json").write_text(json.dumps({"avg_latency": 0.2, "std_latency": 0.0, "latencies": [0.2, 0.2],
                                                   "percentiles": {"50": 0.2, "99": 0.2}, "engine": "torchinferno"}))
    shutil.copy(FIXTURES / "vllm_v0_11" / "serve-c8.json", ours / "serve-c8.json")
    (ours / "commands.json").write_text(json.dumps({"engine": "torchinferno", "commands": []}))
    res = load_results([ours, FIXTURES / "vllm_v0_11"])
    assert {(r.backend, r.kind) for r in res} >= {("torchinferno", "latency"), ("torchinferno", "serve"),
                                                  ("vllm", "serve"), ("vllm", "throughput")}
    html = render_html(res, "mixed")
    p = _parse(html)
    assert p.svgs >= 6 and "torchinferno" in html and "vllm" in html


def test_empty_report_still_renders(tmp_path):
    rc = main(["vllm-bench-plot", str(tmp_path)])
    assert rc == 0
    p = _parse((tmp_path / "performance.html").read_text())
    assert p.tables >= 1


def test_bad_inputs_give_one_line_errors(tmp_path, capsys):
    rc = main(["vllm-bench-plot", str(tmp_path / "missing")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "does not exist" in err[0]

    (tmp_path / "bad.json").write_text('{"avg_latency": 1.0, "latencies": [1.0,')
    rc = main(["vllm-bench-plot", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("error: corrupt JSON in") and "bad.json" in err[0]

    f = tmp_path / "file.txt"
    f.write_text("x")
    rc = main(["vllm-bench-plot", str(f)])
    assert rc == 1 and "is not a directory" in capsys.readouterr().err


def test_svg_charts_handle_degenerate_data():
    from torchinferno.bench import svg

    for chart in (svg.line_chart({"a": [(1, 5.0)]}, "t", "x", "y", log_x=True), svg.line_chart({}, "t", "x", "y"),
                  svg.bar_chart(["only"], {"s": [None]}, "t", "y"), svg.cdf_chart({"a": [0.0, 0.0]}, "t", "x"),
                  svg.bar_chart(["a" * 60, "b"], {"s": [0.0, 3.0]}, "t", "y")):
        p = _parse(chart)
        assert p.svgs == 1
