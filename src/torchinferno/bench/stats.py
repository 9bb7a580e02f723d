"""Summary statistics the way ``vllm bench`` computes them (numpy mean/median/std/percentile).

Every function tolerates an empty list the way vLLM does (``np.mean(values or 0)``), so a run in
which every request failed still produces a complete, all-zero result instead of a crash.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["summarize_ms", "percentile_key", "parse_percentiles", "LATENCY_PERCENTILES", "fmt_num"]

# The percentiles ``vllm bench latency`` reports, in its order.
LATENCY_PERCENTILES = (10, 25, 50, 75, 90, 99)


def percentile_key(p: float) -> str:
    """``99 -> "99"``, ``99.9 -> "99.9"`` (vLLM's ``p{word}_{metric}_ms`` naming)."""
    return str(int(p)) if int(p) == p else str(p)


def parse_percentiles(spec: str) -> list[float]:
    """``"50,90,99"`` -> ``[50.0, 90.0, 99.0]``; raises ``ValueError`` with a one-line message."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise ValueError(f"percentile {part!r} is not a number (example: 50,90,99)") from None
        if not 0 <= v <= 100:
            raise ValueError(f"percentile {v} is outside [0, 100]")
        out.append(v)
    if not out:
        raise ValueError("no percentiles given (example: 50,90,99)")
    return out


def summarize_ms(name: str, values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    """``{mean,median,std}_{name}_ms`` and ``p{P}_{name}_ms`` of ``values_s`` (seconds) in ms."""
    arr = values_s or 0
    out = {
        f"mean_{name}_ms": float(np.mean(arr)) * 1000,
        f"median_{name}_ms": float(np.median(arr)) * 1000,
        f"std_{name}_ms": float(np.std(arr)) * 1000,
    }
    for p in percentiles:
        out[f"p{percentile_key(p)}_{name}_ms"] = float(np.percentile(arr, p)) * 1000
    return out


def fmt_num(v, digits: int = 2) -> str:
    """Compact human formatting for tables: ``None``/NaN -> ``-``."""
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "inf" if v == math.inf else "-"
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}f}"
