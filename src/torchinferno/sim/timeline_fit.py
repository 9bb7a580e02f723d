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

Host-bound vs device-bound (issue 21, run 45): a steady decode period is explained equally well by a long host
launch or a long device step, and the replay on measured starts favours the host story (a device story's per-step
error accumulates along a decode run). The step right after a small prefill tells them apart (run 45: 0.6-1.6 ms,
where the host story prices 5.3 ms, which a C 1 first token pays): ``fit_timeline(anchor=True,
device_bound_graphs=True)`` anchors the device clock to the measured waits and reads the graph step's host side off
those iterations (``graph_host_from_tail``). An option; the default fit is unchanged (docs/SIMULATION.md: better on
run 45, worse on run 37).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from torchinferno.errors import ConfigError
from torchinferno.sim.timeline import PARAMS, BatchShape, TimelineModel, extra_features, graph_step, param_features

__all__ = ["Iteration", "fit_timeline", "iterations_from_probe_rows", "iterations_from_step_log", "replay_periods"]

_IDX = {k: i for i, k in enumerate(PARAMS)}
# a logged wait at most this long is the result's copy and sync alone (the device had finished: run 76's waits
# after host-bound piecewise steps are ~0.04 ms)
WAIT_EPS = 1e-4
_NP = len(PARAMS)


@dataclass(frozen=True)
class Iteration:
    start: float
    end: float
    launched: object = None  # a hashable batch id (or None: launched nothing)
    shape: BatchShape | None = None
    resolved: object = None  # the id of the batch whose result this iteration took
    # measured where the log has them (step_log_version 3, async scheduling): seconds from ``start`` to the end of
    # this iteration's launch (loop overhead, scheduling, inputs, launch), and blocked on ``resolved``'s result
    launch: float | None = None
    wait: float | None = None


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
        launch, wait = r.get("launch"), r.get("wait")
        out.append(Iteration(shift + t - busy_gap, shift + t + float(r["dt"]),
                             None if launched is None else (tag, launched),
                             BatchShape.from_log(r) if launched is not None else None,
                             None if resolved is None else (tag, resolved),
                             None if launch is None else busy_gap + float(launch),
                             None if wait is None else float(wait)))
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


def graph_host_from_tail(its: list[Iteration], graphs: bool, max_prefill: int = 512) -> dict | None:
    """The host side of a replayed decode graph, read off the iterations that reveal it: a graph launch right after
    an eager batch of at most ``max_prefill`` prefill tokens, whose device work ended under its own launch, so the
    period is the graph step's host time alone (scheduling, inputs, launch, the prefill's apply: run 45 ~0.9 ms at
    one row, ~1.6 at 64, against a ~5.3 ms device step). Kept: periods under half the median period of the graph
    iterations with the same rows (the rest waited for the device). Returns ``{"host_step", "host_seq"}``
    (intercept at one row, slope per row, medians) or None without such iterations."""
    import statistics

    if not graphs:
        return None
    shapes = {it.launched: it.shape for it in its if it.launched is not None and it.shape is not None}
    steady: dict[int, list[float]] = {}
    tail: list[tuple[int, float]] = []
    for it in its:
        s = it.shape
        if it.launched is None or s is None or s.prefill_tokens > 0 or s.seqs == 0:
            continue
        prev = shapes.get(it.resolved)
        period = it.end - it.start
        if prev is not None and 0 < prev.prefill_tokens <= max_prefill:
            tail.append((s.seqs, period))
        elif prev is not None and prev.prefill_tokens == 0:
            steady.setdefault(s.seqs, []).append(period)
    kept = [(r, p) for r, p in tail if r in steady and p < 0.5 * statistics.median(steady[r])]
    one = [p for r, p in kept if r == 1]
    if not one:
        return None
    base = statistics.median(one)
    many = [(p - base) / (r - 1) for r, p in kept if r > 1]
    return {"host_step": base, "host_seq": max(0.0, statistics.median(many)) if many else 0.0}


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


def _replay(its: list[Iteration], theta, graphs: bool, overlap: bool, roofline_sum: bool = False,
            anchor: bool = False, prefill_graph_tokens: int = 0, piecewise_graph_tokens: int = 0,
            mixed_graph_tokens: int = 0):
    """``(A [N, P], c [N], branches)``: each iteration's predicted period ``A . theta + c`` under the branch choices
    ``theta`` makes (module docstring); ``branches`` is a tuple of the choices, for convergence.

    ``anchor`` (a device separate from the host): the device clock is re-anchored to the measurement at every
    result taken with nothing else in flight, as the host clock is at every iteration's measured start. When the
    host waited for the result (measured end less the apply after the predicted launch end), the device finished
    then; else it finished no later than the launch end. Without it, a device-bound story accumulates its per-step
    error along a run of decode steps (measured starts advance by the real period, the device by the predicted
    one), so a fit can only follow the periods with host-bound terms."""
    import numpy as np

    th = np.append(theta, 1.0)
    choices: list[bool] = []

    def vmax(a, b):
        if a is None:
            return b
        pick = float(a @ th) >= float(b @ th)
        choices.append(pick)
        return a if pick else b

    def vmin(a, b):
        pick = float(a @ th) <= float(b @ th)
        choices.append(pick)
        return a if pick else b

    device_free = None
    pending: dict = {}
    rows = np.zeros((len(its), _NP + 1))
    feats_cache: dict = {}

    def place(key, after_pre, host, dev, apply, eager):  # the launched batch's device work (module docstring)
        nonlocal device_free
        if eager:
            dev_end = vmax(vmax(device_free, after_pre) + dev, host)
        else:
            dev_end = vmax(device_free, host) + dev
        device_free = vmax(device_free, dev_end)
        pending[key] = (dev_end, apply)

    for i, it in enumerate(its):
        s = _const(it.start)
        deferred = None
        if it.launched is not None and it.shape is not None and it.shape.seqs > 0:
            key = (it.shape, graphs)
            if key not in feats_cache:
                pre, launch, apply, mem, comp = param_features(it.shape, graphs, prefill_graph_tokens,
                                                               piecewise_graph_tokens, mixed_graph_tokens)
                eager = not graph_step(it.shape, graphs, prefill_graph_tokens, mixed_graph_tokens)
                feats_cache[key] = (_vec(pre), _vec(launch), _vec(apply), _vec(mem), _vec(comp),
                                    _vec(extra_features(it.shape)), eager)
            pre, launch, apply, mem, comp, extra, eager = feats_cache[key]
            dev = (mem + comp if roofline_sum else vmax(mem, comp)) + extra
            after_pre = s + pre
            host = after_pre + launch
            if not overlap:
                host = host + dev
                device_free = host
                pending[it.launched] = (host, apply)
            else:
                args = (it.launched, after_pre, host, dev, apply, eager)
                if anchor and it.resolved is not None and it.resolved != it.launched and it.resolved in pending:
                    deferred = args  # queued behind the batch resolved below: placed once that one is anchored
                else:
                    place(*args)
        else:
            host = s + _vec({"host_step": 1.0})
        if it.resolved is not None and it.resolved in pending:
            dev_end, apply = pending.pop(it.resolved)
            launch_end = host
            host = vmax(host, dev_end) + apply
            if anchor and overlap and not pending:
                if it.wait is not None and it.launch is not None:  # measured: did the host wait for the result?
                    waited = it.wait > WAIT_EPS
                    device_free = _const(it.start + it.launch + it.wait) if waited else vmin(dev_end, launch_end)
                else:
                    measured = _const(it.end) - apply
                    device_free = measured if vmax(measured, launch_end) is measured else vmin(dev_end, launch_end)
        if deferred is not None:
            place(*deferred)
        rows[i] = host
        rows[i, -1] -= it.start
    return rows[:, :_NP], rows[:, _NP], tuple(choices)


def replay_periods(its: list[Iteration], model: TimelineModel, anchor: bool = False) -> list[float]:
    """Predicted period (``end - start``) of every iteration under ``model`` (measured starts; ``anchor``: measured
    device ends too, ``_replay``)."""
    import numpy as np

    theta = np.array([model.params[k] for k in PARAMS])
    a, c, _ = _replay(its, theta, model.graphs, model.overlap, anchor=anchor,
                      prefill_graph_tokens=model.prefill_graph_tokens,
                      piecewise_graph_tokens=model.piecewise_graph_tokens,
                      mixed_graph_tokens=model.mixed_graph_tokens)
    return list(a @ theta + c)


def _nnls(a, b):
    import numpy as np

    from torchinferno.sim.cost_model import _nnls as active_set

    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    return active_set(a / scale, b) / scale


def fit_timeline(its: list[Iteration], *, graphs: bool, overlap: bool, async_scheduling: bool = False,
                 weights: str = "sqrt", trim: float | None = None, max_rounds: int = 40,
                 free: tuple[str, ...] = PARAMS, restarts: int = 12, seed: int = 0,
                 anchor: bool | None = None, fixed: dict | None = None,
                 device_bound_graphs: bool = False, prefill_graph_tokens: int = 0,
                 piecewise_graph_tokens: int = 0, mixed_graph_tokens: int = 0,
                 split: bool = False) -> tuple[TimelineModel, float]:
    """Fit (module docstring). Only ``free`` parameters are fitted (others stay 0; ``fixed``: name -> seconds held at
    that value). Returns the model and the mean |relative error| of the predicted periods on the iterations kept.

    ``anchor`` (None: False, True for a split fit): the replay's device clock follows the measured result waits
    (``_replay``); ``trim`` (None: 3, 0 for a split fit). ``device_bound_graphs``
    (a CUDA-graph engine on a separate device; implies nothing without ``anchor`` but is meant with it): the decode
    graph's host side is read off the iterations that reveal it (``graph_host_from_tail``: ``host_step`` /
    ``host_seq`` held there, ``launch_graph``, ``host_batched`` and ``host_token`` held at 0) and the eager launch gets
    its per-row term ``launch_eager_seq``; the rest of a decode period is then the device's. Without it
    ``launch_eager_seq`` stays 0 (the default fit is the one of sessions 13-15). ``prefill_graph_tokens``: the logged
    engine also replayed fresh prompts up to that length from graphs (``TimelineModel.prefill_graph_tokens``);
    ``piecewise_graph_tokens``: it ran other steps up to that many tokens from piecewise graphs (their launch is
    ``launch_piecewise``, and ``launch_piecewise_seq`` is held at 0 as ``launch_eager_seq`` is, but with
    ``device_bound_graphs``); ``mixed_graph_tokens``: it replayed every step up to that many tokens from one whole
    graph (``TimelineModel.mixed_graph_tokens``).

    The replay's branches make local minima (a host-bound and a device-bound story can explain the same periods
    about as well), so besides two fixed starts the descent restarts ``restarts`` times from the best point so far
    with every parameter scaled by a seeded log-uniform factor in [1/4, 4] (zero ones seeded at a typical scale).

    ``split`` (needs measured launch and wait times: a version-3 step log of an async engine on a separate device):
    the host terms come from those measurements (``timeline_split``) and are held; only the device terms are
    fitted, on the anchored replay. An option: on run 76's served pair it predicted no better than the default
    (A -> B 5.8% vs 5.5% mean, B -> A 7.3% vs 5.9%; docs/SIMULATION.md session 29)."""
    import numpy as np

    if weights not in ("relative", "sqrt", "time"):
        raise ConfigError(f"unknown fit weights {weights!r} (valid: relative, sqrt, time)")
    y = np.array([it.end - it.start for it in its])  # [N] measured periods
    if len(its) < 3 or not (y > 0).any():
        raise ConfigError(f"need at least 3 timed iterations to fit a timeline, got {len(its)}")
    ok = y > 0
    w = {"relative": 1.0 / np.maximum(y, 1e-9), "sqrt": 1.0 / np.sqrt(np.maximum(y, 1e-9)),
         "time": np.ones_like(y)}[weights]
    fixed = dict(fixed or {})
    # the replay of these iterations under this engine's graph limits
    replay = functools.partial(_replay, its, graphs=graphs, prefill_graph_tokens=int(prefill_graph_tokens),
                               piecewise_graph_tokens=int(piecewise_graph_tokens),
                               mixed_graph_tokens=int(mixed_graph_tokens))
    split_host = None
    if split and overlap:
        from torchinferno.sim.timeline_split import host_from_split

        split_host = host_from_split(its, graphs, int(prefill_graph_tokens), int(piecewise_graph_tokens),
                                     mixed_graph_tokens=int(mixed_graph_tokens))
    if split and split_host is None:
        raise ConfigError("split fit: the iterations carry no measured launch/wait times (a step_log_version 3 log "
                          "of an async engine on a GPU has them)")
    host = graph_host_from_tail(its, graphs) if device_bound_graphs and overlap and graphs else None
    if split_host is not None:
        # the device clock follows the measured waits: without the anchor a device-bound story drifts from the
        # measured starts along every decode run (run 76's log A: 24% mean period error unanchored, 3.6% anchored)
        fixed = {**split_host, **fixed}
        anchor = True if anchor is None else anchor
        # the host side is measured (and trimmed in its own regressions), so no period is dropped: trimming keeps
        # the rows a first guess prices worst, and those are the prefills whose device work the waits show (a fit
        # that drops them scores 0 error on the rest and wins every comparison)
        trim = 0.0 if trim is None else trim
    elif host is not None:
        fixed = {"launch_graph": 0.0, "host_batched": 0.0, "host_token": 0.0, **host, **fixed}
    else:  # the eager launch's per-row term is part of the device-bound story only (default fits unchanged)
        fixed = {"launch_eager_seq": 0.0, "launch_piecewise_seq": 0.0, **fixed}
    anchor = bool(anchor)
    trim = 3.0 if trim is None else trim
    unknown = set(fixed) - set(PARAMS)
    if unknown:
        raise ConfigError(f"unknown timeline parameters {sorted(unknown)} (valid: {', '.join(PARAMS)})")
    theta_fixed = np.zeros(_NP)  # [P] held values (0 elsewhere)
    for k, v in fixed.items():
        theta_fixed[_IDX[k]] = float(v)
    cols = [_IDX[k] for k in free if k not in fixed]

    def solve(a, c, keep):
        target = y[keep] - c[keep] - a[keep] @ theta_fixed
        ak = a[keep]  # [K, P]
        # a term no kept row exercises stays 0: least squares would give its empty column any value
        used = [j for j in cols if ak[:, j].any()]
        sol = _nnls(ak[:, used] * w[keep, None], target * w[keep])
        theta = theta_fixed.copy()
        theta[used] = np.maximum(sol, 0.0)
        return theta

    max_backs = 8  # damping: halvings of a step that raised the error (a cycle of branch choices otherwise ends it)

    def descend(theta, cols_now):
        nonlocal cols
        cols = cols_now
        best = (math.inf, theta, ok)
        keep = ok
        seen = set()
        backs = 0
        for rnd in range(max_rounds):
            a, c, branches = replay(theta, overlap=overlap, anchor=anchor)
            pred = a @ theta + c
            rel = (pred - y) / np.maximum(y, 1e-12)
            if rnd > 0 and trim:
                keep = ok & (y <= trim * np.maximum(pred, 1e-12))
            err = float(np.mean(np.abs(rel[keep]))) if keep.any() else math.inf
            if err < best[0]:
                best = (err, theta, keep)
                backs = 0
            elif rnd > 0 and backs < max_backs:  # the step made it worse: go back halfway towards the best point
                theta = 0.5 * (theta + best[1])
                backs += 1
                continue
            if (branches, keep.tobytes()) in seen:
                break
            seen.add((branches, keep.tobytes()))
            theta = solve(a, c, keep)
        return best

    full = cols
    # start 1: every part additive (no overlap); start 2: the device does the work (host terms but the eager
    # launch and the apply held at 0 first), then everything free. The replay has local minima (host-bound vs
    # device-bound explanations of the same period): the better end point wins.
    a, c, _ = replay(np.zeros(_NP), overlap=False, roofline_sum=True)  # both roofline columns present
    starts = [solve(a, c, ok)]
    if overlap:
        dev_first = [j for j in full if PARAMS[j] not in ("host_step", "host_seq", "host_token", "host_batched",
                                                                   "launch_graph")]
        cols = dev_first
        a, c, _ = replay(np.zeros(_NP), overlap=False, roofline_sum=True)
        t0 = solve(a, c, ok)
        starts.append(descend(t0, dev_first)[1])
        if piecewise_graph_tokens:  # start 3: piecewise launches at 0 first (mostly hidden behind their device work, they can pull the
            # additive start into a minimum where the prefill compute term is 0), then everything free
            cols = [j for j in full if PARAMS[j] not in ("launch_piecewise", "launch_piecewise_seq")]
            starts.append(descend(solve(a, c, ok), cols)[1])
    best = (math.inf, None, ok)
    for t0 in starts:
        got = descend(t0, full)
        if got[0] < best[0]:
            best = got
    rng = np.random.default_rng(seed)
    a, c, _ = replay(best[1], overlap=overlap, roofline_sum=True, anchor=anchor)
    scale = np.abs(a[ok]).mean(axis=0)  # [P]; 0 for a term no calibration row exercises (CPU: launch_graph)
    # a term worth 10% of a step; a term with no rows starts and stays at 0 (else a restart sets it to
    # median / 1e-30, a value no row can correct, which then prices any such step: a graph replay at 2.8e16 ms)
    typical = np.where(scale > 0, np.median(y[ok]) / np.maximum(scale, 1e-30) * 0.1, 0.0)
    for _ in range(restarts if best[0] > 1e-6 else 0):
        base = np.where(best[1] > 0, best[1], typical)
        t0 = theta_fixed.copy()
        t0[full] = base[full] * np.exp(rng.uniform(-math.log(4), math.log(4), len(full)))
        got = descend(t0, full)
        if got[0] < best[0]:
            best = got
    err, theta, _ = best
    model = TimelineModel(params={k: float(theta[_IDX[k]]) for k in PARAMS}, graphs=graphs, overlap=overlap,
                          async_scheduling=async_scheduling, prefill_graph_tokens=int(prefill_graph_tokens),
                          piecewise_graph_tokens=int(piecewise_graph_tokens),
                          mixed_graph_tokens=int(mixed_graph_tokens))
    return model, err
