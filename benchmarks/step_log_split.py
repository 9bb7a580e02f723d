"""Where a served engine's step time goes, by step kind: host launch vs wait on the device (issue 21).

    PYTHONPATH=src python3 benchmarks/step_log_split.py STEPS.jsonl[.gz]

Needs a step_log_version 3 log of an async engine (``serve --step-log``; each row's ``launch`` and ``wait``). Rows
are grouped by what the launched batch is under the runner's rules (``sim.timeline.graph_step`` /
``piecewise_step`` with the log's graph limits): decode graphs by rows, one fresh prompt from a prefill graph,
piecewise mixed steps, eager steps, and iterations that launched nothing. ``launch`` is the launched batch's host
side; ``wait`` is the previous batch's device tail (the iteration resolves the batch launched before it).
"""

from __future__ import annotations

import argparse

from torchinferno.sim.driver import percentile
from torchinferno.sim.step_log_fit import read_step_log, timeline_flags
from torchinferno.sim.timeline import BatchShape, graph_step, piecewise_step


def kind(row: dict, flags: dict) -> str:
    if row.get("step") is None:
        return "none"
    shape = BatchShape.from_log(row)
    if graph_step(shape, flags["graphs"], flags.get("prefill_graph_tokens", 0)):
        if shape.prefill_tokens:
            return "graph prefill"
        rows = shape.decode_seqs
        return "decode " + ("1" if rows == 1 else "2-16" if rows <= 16 else "17-64" if rows <= 64 else ">64")
    if graph_step(shape, flags["graphs"], 0, flags.get("mixed_graph_tokens", 0)):
        return "whole-step graph"  # --cuda-graph-mixed-mode full: any other step of few enough tokens, one graph
    return "piecewise" if piecewise_step(shape, flags["graphs"], flags.get("piecewise_graph_tokens", 0)) else "eager"


def _ms(xs: list[float], q: float) -> str:
    """The ``q``-th percentile (linear, as the simulator's summaries take it) in ms, or a dash for no values."""
    return f"{percentile(xs, q) * 1e3:7.2f}" if xs else "      -"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step_log")
    a = p.parse_args(argv)
    meta, rows = read_step_log(a.step_log)
    flags = timeline_flags(meta)
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(kind(r, flags), []).append(r)
    print(f"{'launched':14s} {'steps':>6s}   dt p50  launch p50    p90   wait p50 (ms)")
    for k, g in sorted(groups.items()):
        launch = [r["launch"] for r in g if r.get("launch") is not None]
        wait = [r["wait"] for r in g if r.get("wait") is not None]
        print(f"{k:14s} {len(g):6d}  {_ms([r['dt'] for r in g], 50)}  {_ms(launch, 50)}  {_ms(launch, 90)}  "
              f"{_ms(wait, 50)}")
    if not any(r.get("launch") is not None for r in rows):
        print("(no launch/wait in this log: step_log_version < 3 or a synchronous engine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
