"""Calibrate the simulator from a served run: ``serve --step-log FILE`` -> ``sim-calibrate --from-step-log FILE``.

A step log (``engine.step_log``) holds every engine-core step of a real server under real traffic: the batch it
launched, the batch whose result it applied, its host time and the loop time around it. That is the same
information the probes of ``sim.calibrate`` collect in process, measured where users serve, so a calibration
can be fitted from the run that a benchmark measured (``bench-serve``) and checked against another one.

Attribution is ``calibrate.StepAttribution``'s: the period of a step (the loop time since the previous step's
end — ``gap`` less ``idle``, the part spent waiting with nothing to run — plus ``dt``) is charged to the batch
whose result it applied; a period that applied nothing (the first launch of a burst under async scheduling) is
carried into the next charge and marks that launch ``drained``; ``prefill_step`` says whether the batch launched in
the period ran eagerly (it had a prefill chunk).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from torchinferno.errors import ConfigError
from torchinferno.sim.calibrate import fit_rows
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.cost_model import FEATURES

__all__ = ["calibration_from_step_logs", "read_step_log", "rows_from_step_log", "shape_features"]

PREFILL_STEP = FEATURES.index("prefill_step")
DRAINED = FEATURES.index("drained_prefill")


def read_step_log(path: str | Path, for_fit: bool = True) -> tuple[dict, list[dict]]:
    """``(meta, step rows)`` of a step log (``.gz`` too). Raises ConfigError naming the file and line.

    ``for_fit``: every row must carry the cost fit's fields (``dt``; ``resolved`` from step_log_version 2); readers
    of the queue fields only (``sim.arrival_replay``) pass False and need just the meta line."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"step log not found: {p}")
    opener = gzip.open if p.suffix == ".gz" else open
    meta, rows = None, []
    with opener(p, "rt") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{p}:{n}: not JSON") from None
            if "meta" in d:
                meta = d["meta"]
                continue
            if for_fit and "dt" not in d:
                raise ConfigError(f"{p}:{n}: not a step row (no 'dt')")
            rows.append(d)
    if meta is None and not for_fit:
        raise ConfigError(f"{p}: not a step log (no meta line; write one with serve --step-log)")
    if for_fit and (meta is None or "resolved" not in (rows[0] if rows else {"resolved": 0})):
        raise ConfigError(f"{p} is a step log without the calibration fields (written before step_log_version 2); "
                          "record a new one with serve --step-log")
    return meta, rows


def shape_features(row: dict, drained: bool = False) -> list[float]:
    """The cost model's feature vector (``FEATURES`` order, knee 0) of a logged batch shape."""
    dec, pre = row.get("decode_seqs", 0), row.get("prefill_tokens", 0)
    feats = dict.fromkeys(FEATURES, 0.0)
    feats.update(seqs=row.get("seqs", 0), prefill_tokens=pre, decode_tokens=dec, decode_ctx=row.get("decode_ctx", 0),
                 prefill_attn=row.get("prefill_attn", 0.0), decode_ctx_padded=dec * row.get("decode_ctx_max", 0),
                 prefill_step=1.0 if pre else 0.0, drained_prefill=1.0 if pre and drained else 0.0)
    return [float(feats[f]) for f in FEATURES]


def rows_from_step_log(rows: list[dict]) -> list[tuple[tuple, float]]:
    """``(features, seconds)`` per applied batch (module docstring). Rows without a launched or applied batch
    (an empty step) only carry their time."""
    shapes: dict[int, dict] = {}
    drained: set[int] = set()
    out: list[tuple[tuple, float]] = []
    carry = 0.0
    for r in rows:
        period = r["dt"] + max(0.0, (r.get("gap") or 0.0) - r.get("idle", 0.0))
        launched, resolved = r.get("step"), r.get("resolved")
        if launched is not None:
            shapes[launched] = r
        if resolved is None or resolved not in shapes:
            carry += period
            if launched is not None and launched != resolved:
                drained.add(launched)
            continue
        seconds, carry = carry + period, 0.0
        feats = shape_features(shapes.pop(resolved), resolved in drained)
        drained.discard(resolved)
        if launched is not None and launched != resolved:  # async: the period launched another batch
            feats[PREFILL_STEP] = 1.0 if shapes[launched].get("prefill_tokens", 0) else 0.0
        elif launched is None:
            feats[PREFILL_STEP] = 0.0
        out.append((tuple(feats), seconds))
    return out


def timeline_flags(meta: dict) -> dict:
    """``TimelineModel`` flags of a logged engine: CUDA graphs for decode steps (and for fresh prompts up to
    ``prefill_graph_tokens``: logs before session 26 have no such key, their prefill was eager; other steps up to
    ``piecewise_graph_tokens`` from piecewise graphs: 0 before session 28, or from one whole graph each when the log's
    ``mixed_graph_mode`` is "full": ``mixed_graph_tokens``), a device separate from the host."""
    dev = str(meta.get("device", "cpu"))
    graphs = "cuda-graphs" in str(meta.get("engine", ""))
    other = int(meta.get("piecewise_graph_tokens", 0)) if graphs else 0
    full = meta.get("mixed_graph_mode") == "full"
    return {"graphs": graphs, "overlap": dev.startswith("cuda"), "async_scheduling": bool(meta.get("async_scheduling")),
            "prefill_graph_tokens": int(meta.get("prefill_graph_tokens", 0)) if graphs else 0,
            "piecewise_graph_tokens": 0 if full else other, "mixed_graph_tokens": other if full else 0}


def calibration_from_step_logs(paths: list[str], log=print, weights: str = "sqrt",
                               cost_model: str = "auto", timeline_weights: str = "time",
                               timeline_fit: dict | None = None) -> Calibration:
    """Fit one calibration from the steps of one or more step logs of the same engine (same meta). ``weights``:
    ``cost_model.fit``'s; ``sqrt`` by default here: a served log holds thousands of decode steps and a few long
    prefills that set TTFT under load (run 37: out-of-sample mean error 38% relative, 26% sqrt, 21% time).
    ``cost_model`` ``auto`` / ``timeline`` also fits a ``TimelineModel`` (``sim.timeline_fit``) from the same
    logs, stored in ``Calibration.timeline`` (least squares on seconds, ``timeline_weights="time"``: on run 37 the
    out-of-sample mean error was 15.3% with time weights, 19.1% relative, 36.9% sqrt, no admission time);
    ``linear`` fits the per-step model only."""
    from torchinferno.sim.timeline_fit import fit_timeline, iterations_from_step_log

    metas, steps, its = [], [], []
    for path in paths:
        meta, rows = read_step_log(path)
        its = iterations_from_step_log(rows, its)
        got = rows_from_step_log(rows)
        log(f"sim-calibrate: {path}: {len(rows)} logged steps -> {len(got)} timed batches")
        metas.append(meta)
        steps += got
    if not steps:
        raise ConfigError("the step logs hold no timed batch (did the server serve anything?)")
    meta = metas[0]
    keys = ("async_scheduling", "engine", "kv_dtype", "block_size")
    for p, m in zip(paths[1:], metas[1:]):
        if any(m.get(k) != meta.get(k) for k in keys):
            raise ConfigError(f"step log {p} is of another engine than {paths[0]} ({', '.join(keys)} differ)")
    async_steps = bool(meta.get("async_scheduling"))
    cost, err = fit_rows(steps, async_steps=async_steps, weights=weights)
    timeline = None
    if cost_model in ("auto", "timeline"):
        tl, tl_err = fit_timeline(its, weights=timeline_weights, **timeline_flags(meta), **(timeline_fit or {}))
        timeline = {**tl.as_dict(), "fit_error": tl_err, "num_samples": len(its)}
        if timeline_fit:
            timeline["fit_options"] = dict(timeline_fit)
        log(f"sim-calibrate: timeline fitted on {len(its)} loop iterations (mean |error| of periods {tl_err * 100:.1f}%)")
    return Calibration(timeline=timeline, 
        cost=cost, model=str(meta.get("model", "unknown")), device=str(meta.get("device", "unknown")),
        dtype=str(meta.get("dtype", "unknown")), kv_dtype=str(meta.get("kv_dtype", "unknown")),
        kv_bytes_per_elem=int(meta.get("kv_bytes_per_elem", 0)), num_layers=int(meta.get("num_layers", 0)),
        hidden_size=int(meta.get("hidden_size", 0)), kv_bytes_per_token=int(meta.get("kv_bytes_per_token", 0)),
        num_samples=len(steps), fit_error=err, source=",".join(f"step-log:{p}" for p in paths),
        extra={"async_scheduling": async_steps, "fit_weights": weights, "engine_limits": {k: meta.get(k) for k in (
            "block_size", "num_blocks", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
            "enable_prefix_caching")} | {k: meta[k] for k in ("num_sliding_blocks", "sliding_window") if k in meta}
            # logs before session 27 ran no lone prefill steps
            | {"lone_prefill_tokens": int(meta.get("lone_prefill_tokens", 0))}},
    )
