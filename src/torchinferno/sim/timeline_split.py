"""The host side of a timeline, read off measured launch and wait times (step_log_version 3, async scheduling).

A served step log's ``dt`` alone cannot tell a long host step from a long device step: in a steady decode run both
give the same period (``timeline_fit``'s module docstring; issue 21 runs 45-74, where the default fit came out
host-bound and priced a lone graph prefill at 8.7 ms against 6.1 measured). Version 3 logs split each iteration:
``launch`` (loop overhead, scheduling, inputs, the launch), ``wait`` (blocked on the previous batch's result) and
the rest of ``dt``, which applies that result. The timeline's host terms are then a linear regression each:

    launch_i = pre(shape_i) . theta_host + launch(shape_i) . theta_host     # iterations that launched a batch
    dt_i - launch_i - wait_i = apply_row * rows(resolved batch)             # iterations that took a result

with no branch of the replay involved. An iteration that launched nothing (it only took a result) is a row of
``host_step`` alone, as the timeline prices it; those rows tell ``host_step`` from the launch terms. :func:`host_from_split` returns them; ``fit_timeline`` holds them fixed and
fits only the device terms on the anchored replay (the device clock follows the measured waits).

Robustness: a row whose measurement is more than ``trim`` times its prediction either way (a garbage collection, a
compile) is dropped and the regression redone, twice.
"""

from __future__ import annotations

from torchinferno.sim.timeline import HOST_PARAMS, param_features

__all__ = ["MIN_ROWS", "host_from_split"]

MIN_ROWS = 20  # launched iterations with a measured launch needed before the split is trusted


def _regress(rows: list[dict], y: list[float], names: tuple[str, ...], trim: float) -> dict:
    """Non-negative least squares of ``y`` on the ``names`` columns of ``rows`` (sqrt weights: a 40 ms eager
    launch and a 0.3 ms graph launch both count), with outlier trimming. Columns no row exercises stay 0."""
    import numpy as np

    from torchinferno.sim.timeline_fit import _nnls  # column-scaled active-set NNLS

    a = np.array([[r.get(k, 0.0) for k in names] for r in rows])  # [N, P]
    b = np.array(y)  # [N]
    floor = 1e-5  # 10 us: a measured 0 (an empty step of a synthetic log) is a valid row, not an infinite weight
    keep = b >= 0
    theta = np.zeros(len(names))
    for _ in range(3):
        ak, bk = a[keep], b[keep]
        used = [j for j in range(len(names)) if ak[:, j].any()]
        if not used:
            break
        w = 1.0 / np.sqrt(np.maximum(bk, floor))
        sol = _nnls(ak[:, used] * w[:, None], bk * w)
        theta = np.zeros(len(names))
        theta[used] = np.maximum(sol, 0.0)
        ratio = np.maximum(b, floor) / np.maximum(a @ theta, floor)
        new = (b >= 0) & (ratio <= trim) & (ratio >= 1.0 / trim)
        if new.sum() < max(3, keep.sum() // 2) or (new == keep).all():
            break
        keep = new
    return {k: float(v) for k, v in zip(names, theta)}


def host_from_split(its, graphs: bool, prefill_graph_tokens: int = 0, piecewise_graph_tokens: int = 0,
                    trim: float = 3.0, mixed_graph_tokens: int = 0) -> dict | None:
    """``{host parameter: seconds}`` for every host term (``HOST_PARAMS``) from the measured split of ``its``
    (``timeline_fit.Iteration`` with ``launch`` / ``wait``), or None when fewer than :data:`MIN_ROWS` launched
    iterations carry it (a synchronous engine, an older log)."""
    host_names = tuple(k for k in HOST_PARAMS if k != "apply_row")
    shapes = {}
    launch_rows, launch_y = [], []
    empty = 0
    for it in its:
        if it.launched is None or it.shape is None or it.shape.seqs == 0:
            if it.launch is not None:  # launched nothing: the timeline prices it at host_step alone
                launch_rows.append({"host_step": 1.0})
                launch_y.append(it.launch)
                empty += 1
            continue
        shapes[it.launched] = it.shape
        if it.launch is None:
            continue
        pre, launch, _, _, _ = param_features(it.shape, graphs, prefill_graph_tokens, piecewise_graph_tokens,
                                              mixed_graph_tokens)
        launch_rows.append({**pre, **launch})
        launch_y.append(it.launch)
    if len(launch_rows) - empty < MIN_ROWS:
        return None
    out = _regress(launch_rows, launch_y, host_names, trim)
    apply_rows, apply_y = [], []
    for it in its:
        shape = shapes.get(it.resolved)
        if shape is None or it.launch is None or it.wait is None:
            continue
        apply_rows.append({"apply_row": float(shape.seqs)})
        apply_y.append(it.end - it.start - it.launch - it.wait)
    out["apply_row"] = _regress(apply_rows, apply_y, ("apply_row",), trim)["apply_row"] if apply_rows else 0.0
    return out
