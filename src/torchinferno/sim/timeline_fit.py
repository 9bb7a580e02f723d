"""Fit a ``TimelineModel`` to measured engine-loop iterations (served step logs or synchronous probes).

Input: ``Iteration`` rows, one per engine-loop pass: the host time it started (``start``, measured) and ended
(``end``, measured), the batch it launched (an id and a ``BatchShape``, or none) and the id of the batch whose
result it took (or none). A served step log gives them directly (``iterations_from_step_log``: start = the step's
``t`` less the non-idle loop time before it, end = ``t + dt``); synchronous probe rows give one iteration per step
that launches and resolves the same batch (``iterations_from_probe_rows``).

Method: every time in the replay of ``timeline.Timeline``'s rules is an affine function of the parameters plus
measured constants, except where a ``max`` picks a branch. For the current parameters the replay picks each
branch, giving each iteration's predicted period ``end - start`` as ``A_i . theta + c_i``; non-negative least squares
on ``y_i - c_i = A_i . theta`` (weights ``relative`` / ``sqrt`` / ``time``) gives new parameters, and the replay is
redone until the branches stop changing (a Gauss-Newton step on a piecewise-linear function; the best iterate is
kept). The host start of every iteration is the measured one, so an error in one step does not shift the rest.
Iterations measured more than ``trim`` times slower than predicted (a compile, interference) are dropped from
the least squares after the first pass (they still drive the replay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchinferno.errors import ConfigError
from torchinferno.sim.timeline import PARAMS, BatchShape, TimelineModel, extra_features, param_features

__all__ = ["Iteration", "fit_timeline", "iterations_from_probe_rows", "iterations_from_step_log", "replay_periods"]

_IDX = {k: i for i, k in enumerate(PARAMS)}
_NP = len(PARAMS)


@dataclass(frozen=True)
class Iteration:
    start: float
    end: float
    launched: object = None  # a hashable batch id (or None: launched nothing)
    shape: BatchShape | None = None
    resolved: object = None  # the id of the batch whose result this iteration took


def iterations_from_step_log(rows: list[dict], after: list[Iteration] | None = None) -> list[Iteration]:
    """One ``Iteration`` per logged step (``engine.step_log`` rows, meta line removed). ``after``: iterations of
    earlier logs, returned followed by these, shifted to start a second after them with distinct batch ids (so
    one replay never waits on another log's device)."""
    out = list(after or [])
    shift = (max(it.end for it in out) + 1.0) if out else 0.0
    tag = len({it.launched[0] for it in out if isinstance(it.launched, tuple)}) if out else 0
    for r in rows:
        busy_gap = max(0.0, (r.get("gap") or 0.0) - r.get("idle", 0.0))
        t = float(r["t"])
        launched = r.get("step")
        resolved = r.get("resolved")
        out.append(Iteration(shift + t - busy_gap, shift + t + float(r["dt"]),
                             None if launched is None else (tag, launched),
                             BatchShape.from_log(r) if launched is not None else None,
                             None if resolved is None else (tag, resolved)))
    return out


def iterations_from_probe_rows(rows: list[tuple[tuple, float]]) -> list[Iteration]:
    """Synchronous probe rows (``cost_model.FEATURES`` order: seqs, prefill_tokens, decode_tokens, decode_ctx,
    prefill_attn, excess, decode_ctx_padded, ...) -> back-to-back iterations launching and resolving one batch."""
    out, t = [], 0.0
    for i, (f, sec) in enumerate(rows):
        seqs, pre, dec, ctx, attn = int(f[0]), int(f[1]), int(f[2]), int(f[3]), float(f[4])
        ctx_max = int(round(f[6] / dec)) if dec and len(f) > 6 else 0
        shape = BatchShape(seqs, pre + dec, dec, pre, ctx, ctx_max, attn)
        out.append(Iteration(t, t + float(sec), i, shape, i))
        t += float(sec)
    return out


def _vec(d: dict):
    import numpy as np

    v = np.zeros(_NP + 1)
    for k, x in d.items():
        v[_IDX[k]] += x
    return v


def _const(c: float):
    import numpy as np

    v = np.zeros(_NP + 1)
    v[-1] = c
    return v


def _replay(its: list[Iteration], theta, graphs: bool, overlap: bool, roofline_sum: bool = False):
    """``(A [N, P], c [N], branches)``: each iteration's predicted period ``A . theta + c`` under the branch choices
    ``theta`` makes (module docstring); ``branches`` is a tuple of the choices, for convergence."""
    import numpy as np

    th = np.append(theta, 1.0)
    choices: list[bool] = []

    def vmax(a, b):
        if a is None:
            return b
        pick = float(a @ th) >= float(b @ th)
        choices.append(pick)
        return a if pick else b

    device_free = None
    pending: dict = {}
    rows = np.zeros((len(its), _NP + 1))
    feats_cache: dict = {}
    for i, it in enumerate(its):
        s = _const(it.start)
        if it.launched is not None and it.shape is not None and it.shape.seqs > 0:
            key = (it.shape, graphs)
            if key not in feats_cache:
                pre, launch, apply, mem, comp = param_features(it.shape, graphs)
                feats_cache[key] = (_vec(pre), _vec(launch), _vec(apply), _vec(mem), _vec(comp),
                                    _vec(extra_features(it.shape)))
            pre, launch, apply, mem, comp, extra = feats_cache[key]
            dev = (mem + comp if roofline_sum else vmax(mem, comp)) + extra
            after_pre = s + pre
            host = after_pre + launch
            if not overlap:
                host = host + dev
                dev_end = host
            elif it.shape.prefill_tokens > 0 or not graphs:
                dev_end = vmax(vmax(device_free, after_pre) + dev, host)
            else:
                dev_end = vmax(device_free, host) + dev
            device_free = vmax(device_free, dev_end)
            pending[it.launched] = (dev_end, apply)
        else:
            host = s + _vec({"host_step": 1.0})
        if it.resolved is not None and it.resolved in pending:
            dev_end, apply = pending.pop(it.resolved)
            host = vmax(host, dev_end) + apply
        rows[i] = host
        rows[i, -1] -= it.start
    return rows[:, :_NP], rows[:, _NP], tuple(choices)


def replay_periods(its: list[Iteration], model: TimelineModel) -> list[float]:
    """Predicted period (``end - start``) of every iteration under ``model`` (measured starts)."""
    import numpy as np

    theta = np.array([model.params[k] for k in PARAMS])
    a, c, _ = _replay(its, theta, model.graphs, model.overlap)
    return list(a @ theta + c)


def _nnls(a, b):
    import numpy as np

    from torchinferno.sim.cost_model import _nnls as active_set

    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    return active_set(a / scale, b) / scale


def fit_timeline(its: list[Iteration], *, graphs: bool, overlap: bool, async_scheduling: bool = False,
                 weights: str = "sqrt", trim: float = 3.0, max_rounds: int = 40,
                 free: tuple[str, ...] = PARAMS, restarts: int = 12, seed: int = 0) -> tuple[TimelineModel, float]:
    """Fit (module docstring). Only ``free`` parameters are fitted (others stay 0). Returns the model and the
    mean |relative error| of the predicted periods on the iterations kept.

    The replay's branches make local minima (a host-bound and a device-bound story can explain the same periods
    about as well), so besides two fixed starts the descent restarts ``restarts`` times from the best point so far
    with every parameter scaled by a seeded log-uniform factor in [1/4, 4] (zero ones seeded at a typical scale)."""
    import numpy as np

    if weights not in ("relative", "sqrt", "time"):
        raise ConfigError(f"unknown fit weights {weights!r} (valid: relative, sqrt, time)")
    y = np.array([it.end - it.start for it in its])  # [N] measured periods
    if len(its) < 3 or not (y > 0).any():
        raise ConfigError(f"need at least 3 timed iterations to fit a timeline, got {len(its)}")
    ok = y > 0
    w = {"relative": 1.0 / np.maximum(y, 1e-9), "sqrt": 1.0 / np.sqrt(np.maximum(y, 1e-9)),
         "time": np.ones_like(y)}[weights]
    cols = [_IDX[k] for k in free]

    def solve(a, c, keep):
        sol = _nnls((a[keep][:, cols]) * w[keep, None], (y[keep] - c[keep]) * w[keep])
        theta = np.zeros(_NP)
        theta[cols] = np.maximum(sol, 0.0)
        return theta

    def descend(theta, cols_now):
        nonlocal cols
        cols = cols_now
        best = (math.inf, theta, ok)
        keep = ok
        seen = set()
        for rnd in range(max_rounds):
            a, c, branches = _replay(its, theta, graphs, overlap)
            pred = a @ theta + c
            rel = (pred - y) / np.maximum(y, 1e-12)
            if rnd > 0 and trim:
                keep = ok & (y <= trim * np.maximum(pred, 1e-12))
            err = float(np.mean(np.abs(rel[keep]))) if keep.any() else math.inf
            if err < best[0]:
                best = (err, theta, keep)
            if (branches, keep.tobytes()) in seen:
                break
            seen.add((branches, keep.tobytes()))
            theta = solve(a, c, keep)
        return best

    full = cols
    # start 1: every part additive (no overlap); start 2: the device does the work (host terms but the eager
    # launch and the apply held at 0 first), then everything free. The replay has local minima (host-bound vs
    # device-bound explanations of the same period): the better end point wins.
    a, c, _ = _replay(its, np.zeros(_NP), graphs, False, roofline_sum=True)  # both roofline columns present
    starts = [solve(a, c, ok)]
    if overlap:
        dev_first = [j for j in full if PARAMS[j] not in ("host_step", "host_seq", "host_token", "host_batched",
                                                                   "launch_graph")]
        cols = dev_first
        a, c, _ = _replay(its, np.zeros(_NP), graphs, False, roofline_sum=True)
        t0 = solve(a, c, ok)
        starts.append(descend(t0, dev_first)[1])
    best = (math.inf, None, ok)
    for t0 in starts:
        got = descend(t0, full)
        if got[0] < best[0]:
            best = got
    rng = np.random.default_rng(seed)
    a, c, _ = _replay(its, best[1], graphs, overlap, roofline_sum=True)
    typical = np.median(y[ok]) / np.maximum(np.abs(a[ok]).mean(axis=0), 1e-30) * 0.1  # [P] a term worth 10%
    for _ in range(restarts if best[0] > 1e-6 else 0):
        base = np.where(best[1] > 0, best[1], typical)
        t0 = np.zeros(_NP)
        t0[full] = base[full] * np.exp(rng.uniform(-math.log(4), math.log(4), len(full)))
        got = descend(t0, full)
        if got[0] < best[0]:
            best = got
    err, theta, _ = best
    model = TimelineModel(params={k: float(theta[_IDX[k]]) for k in PARAMS}, graphs=graphs, overlap=overlap,
                          async_scheduling=async_scheduling)
    return model, err
