"""Tiny inline-SVG charts (no dependencies) for self-contained HTML reports.

Three shapes cover the benchmark report: ``line_chart`` (x/y series with markers, e.g.
throughput vs concurrency), ``bar_chart`` (grouped bars, e.g. TTFT mean/p50/p90/p99 per run)
and ``cdf_chart`` (empirical CDFs of per-request latencies). Every data mark carries a
``<title>`` so hovering shows the exact value. Output is a string starting with ``<svg``.
"""

from __future__ import annotations

import math
from html import escape

__all__ = ["line_chart", "bar_chart", "cdf_chart", "PALETTE", "empty_chart"]

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22"]
_M = {"l": 64, "r": 16, "t": 34, "b": 48}  # margins
_LEGEND_W = 230


def _nice_step(span: float, target: int = 5) -> float:
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Evenly spaced "nice" ticks covering [lo, hi] (the last tick is >= hi)."""
    step = _nice_step(hi - lo, target)
    start = math.floor(lo / step + 1e-9) * step
    end = math.ceil(hi / step - 1e-9) * step
    n = max(1, min(50, round((end - start) / step)))
    return [round(start + i * step, 12) for i in range(n + 1)]


def _fmt(v: float) -> str:
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


def _open(width: int, height: int, title: str) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
            f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" font-size="14" font-weight="600">{escape(title)}</text>']


def _short(name: str, n: int) -> str:
    """Shorten in the middle so both the start (backend) and the end (run) stay readable."""
    if len(name) <= n:
        return name
    head = (n - 1) // 2
    return name[:head] + "…" + name[len(name) - (n - 1 - head):]


def _legend(parts: list[str], names: list[str], x0: float, y0: float) -> None:
    for i, name in enumerate(names):
        y = y0 + 18 * i
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x0:.1f}" y="{y - 9:.1f}" width="12" height="12" fill="{color}"/>')
        label = _short(name, 34)
        parts.append(f'<text x="{x0 + 17:.1f}" y="{y + 1:.1f}" font-size="11">{escape(label)}<title>{escape(name)}</title></text>')


def _axes(parts, x0, y0, x1, y1, yticks, ymap, xlabel, ylabel):
    for t in yticks:
        y = ymap(t)
        parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>')
    parts.append(f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="#333"/>')
    parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>')
    parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{y1 + 38}" text-anchor="middle" font-size="12">{escape(xlabel)}</text>')
    parts.append(f'<text x="14" y="{(y0 + y1) / 2:.1f}" text-anchor="middle" font-size="12" '
                 f'transform="rotate(-90 14 {(y0 + y1) / 2:.1f})">{escape(ylabel)}</text>')


def empty_chart(title: str, message: str, width: int = 720, height: int = 120) -> str:
    parts = _open(width, height, title)
    parts.append(f'<text x="{width / 2:.1f}" y="{height / 2 + 10:.1f}" text-anchor="middle" font-size="12" '
                 f'fill="#777">{escape(message)}</text>')
    return "\n".join(parts + ["</svg>"])


def line_chart(series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str,
               width: int = 720, height: int = 360, log_x: bool = False) -> str:
    """One polyline + markers per series; x sorted; ``log_x`` for concurrency sweeps (1, 2, 4 ...)."""
    pts_all = [(x, y) for pts in series.values() for x, y in pts if x is not None and y is not None]
    if not pts_all:
        return empty_chart(title, "no data")
    log_x = log_x and all(x > 0 for x, _ in pts_all)
    fx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    xs = [fx(x) for x, _ in pts_all]
    xlo, xhi = min(xs), max(xs)
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1
    ymax = max(y for _, y in pts_all)
    yticks = _ticks(0, ymax if ymax > 0 else 1)
    ytop = yticks[-1] or 1
    x0, y0, x1, y1 = _M["l"], _M["t"], width - _M["r"] - _LEGEND_W, height - _M["b"]
    pad = 0.04 * (xhi - xlo)
    xmap = lambda v: x0 + (fx(v) - xlo + pad) / (xhi - xlo + 2 * pad) * (x1 - x0)  # noqa: E731
    ymap = lambda v: y1 - v / ytop * (y1 - y0)  # noqa: E731
    parts = _open(width, height, title)
    _axes(parts, x0, y0, x1, y1, yticks, ymap, xlabel, ylabel)
    xvals = sorted({x for x, _ in pts_all})
    if log_x or len(xvals) <= 12:
        xt = xvals
    else:
        xt = [v for v in _ticks(min(xvals), max(xvals)) if min(xvals) <= v <= max(xvals)]
    for v in xt:
        parts.append(f'<text x="{xmap(v):.1f}" y="{y1 + 16}" text-anchor="middle" font-size="11">{_fmt(v)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted((x, y) for x, y in pts if x is not None and y is not None)
        if len(pts) > 1:
            path = " ".join(f"{xmap(x):.1f},{ymap(y):.1f}" for x, y in pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            parts.append(f'<circle cx="{xmap(x):.1f}" cy="{ymap(y):.1f}" r="4" fill="{color}">'
                         f'<title>{escape(name)}: x={_fmt(x)}, y={y:.4g}</title></circle>')
    _legend(parts, list(series), x1 + 14, y0 + 10)
    return "\n".join(parts + ["</svg>"])


def bar_chart(categories: list[str], series: dict[str, list[float | None]], title: str, ylabel: str,
              width: int = 720, height: int = 360) -> str:
    """Grouped bars: one group per category, one bar per series (``None`` leaves a gap)."""
    vals = [v for vs in series.values() for v in vs if v is not None]
    if not categories or not vals:
        return empty_chart(title, "no data")
    yticks = _ticks(0, max(vals) if max(vals) > 0 else 1)
    ytop = yticks[-1] or 1
    group_w = (width - _M["r"] - _LEGEND_W - _M["l"]) / len(categories)
    rotate = any(len(c) * 6 > group_w for c in categories)
    if rotate:
        height += 60
    x0, y0, x1, y1 = _M["l"] + (40 if rotate else 0), _M["t"], width - _M["r"] - _LEGEND_W, height - _M["b"] - (60 if rotate else 0)
    group_w = (x1 - x0) / len(categories)
    ymap = lambda v: y1 - v / ytop * (y1 - y0)  # noqa: E731
    parts = _open(width, height, title)
    _axes(parts, x0, y0, x1, y1, yticks, ymap, "", ylabel)
    n = max(1, len(series))
    bar_w = max(2.0, group_w * 0.8 / n)
    for gi, cat in enumerate(categories):
        gx = x0 + gi * group_w + group_w * 0.1
        for si, (name, vs) in enumerate(series.items()):
            v = vs[gi] if gi < len(vs) else None
            if v is None:
                continue
            color = PALETTE[si % len(PALETTE)]
            y = ymap(max(v, 0))
            parts.append(f'<rect x="{gx + si * bar_w:.1f}" y="{y:.1f}" width="{bar_w - 1:.1f}" height="{y1 - y:.1f}" '
                         f'fill="{color}"><title>{escape(cat)} / {escape(name)}: {v:.4g}</title></rect>')
        label = _short(cat, 26)
        cx = x0 + (gi + 0.5) * group_w
        if rotate:
            parts.append(f'<text x="{cx:.1f}" y="{y1 + 14}" text-anchor="end" font-size="10" '
                         f'transform="rotate(-35 {cx:.1f} {y1 + 14})">{escape(label)}<title>{escape(cat)}</title></text>')
        else:
            parts.append(f'<text x="{cx:.1f}" y="{y1 + 16}" text-anchor="middle" font-size="10">'
                         f'{escape(label)}<title>{escape(cat)}</title></text>')
    _legend(parts, list(series), x1 + 14, y0 + 10)
    return "\n".join(parts + ["</svg>"])


def cdf_chart(series: dict[str, list[float]], title: str, xlabel: str, width: int = 720, height: int = 360,
              max_points: int = 400) -> str:
    """Empirical CDF (step line) per series; long series are thinned to ``max_points`` steps."""
    series = {k: sorted(v) for k, v in series.items() if v}
    if not series:
        return empty_chart(title, "no per-request data in these results")
    xmax = max(v[-1] for v in series.values())
    xmin = min(0.0, min(v[0] for v in series.values()))
    xticks = _ticks(xmin, xmax if xmax > xmin else xmin + 1)
    xlo, xhi = xticks[0], xticks[-1] if xticks[-1] > xticks[0] else xticks[0] + 1
    yticks = [0, 0.25, 0.5, 0.75, 1.0]
    x0, y0, x1, y1 = _M["l"], _M["t"], width - _M["r"] - _LEGEND_W, height - _M["b"]
    xmap = lambda v: x0 + (v - xlo) / (xhi - xlo) * (x1 - x0)  # noqa: E731
    ymap = lambda v: y1 - v * (y1 - y0)  # noqa: E731
    parts = _open(width, height, title)
    _axes(parts, x0, y0, x1, y1, yticks, ymap, xlabel, "fraction of requests")
    for v in xticks:
        parts.append(f'<text x="{xmap(v):.1f}" y="{y1 + 16}" text-anchor="middle" font-size="11">{_fmt(v)}</text>')
    for i, (name, vs) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        n = len(vs)
        idx = range(n) if n <= max_points else sorted({round(j * (n - 1) / (max_points - 1)) for j in range(max_points)})
        pts, prev_y = [f"{xmap(vs[0]):.1f},{ymap(0):.1f}"], 0.0
        for j in idx:
            x, y = xmap(vs[j]), (j + 1) / n
            pts.append(f"{x:.1f},{ymap(prev_y):.1f}")
            pts.append(f"{x:.1f},{ymap(y):.1f}")
            prev_y = y
        p50, p99 = vs[min(n - 1, int(0.5 * n))], vs[min(n - 1, int(0.99 * n))]
        parts.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" stroke-width="2">'
                     f'<title>{escape(name)}: n={n}, p50={p50:.4g}, p99={p99:.4g}</title></polyline>')
    _legend(parts, list(series), x1 + 14, y0 + 10)
    return "\n".join(parts + ["</svg>"])
