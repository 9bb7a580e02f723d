"""Re-fit run33's H200 steps (``steps_h200_8b.jsonl.gz``), recorded before ``StepAttribution``.

run33 charged the whole period of ``step()`` k+1 (launch of k+1, then wait for k) to step k under async
scheduling. So row i's seconds = launch(i+1) + wait(i): the ``prefill_step`` term (an eager step's launch)
belongs to the *next* row in the same probe scenario. This script builds that shifted design (scenario
boundaries from the probe grid: three fixed scenarios of ``decode_steps`` rows, then one mixed loop, per
batch size) and fits it; the coefficients are the per-step cost model the simulator needs. Usage:
``PYTHONPATH=src python benchmarks/refit_run33.py [steps.jsonl.gz] [out.json]``.
"""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np

from torchinferno.sim.calibrate import fit_rows
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.cost_model import FEATURES

PSTEP = FEATURES.index("prefill_step")


def load(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def scenario_starts(rows, batches=(1, 2, 4, 8, 16), ctxs=(32, 256, 512), decode_steps=16):
    """Row indices where a probe scenario starts (its launch-only first step() was not recorded)."""
    starts, i = [], 0
    for bi, b in enumerate(batches):
        for c in ctxs:
            f = rows[i]["features"]
            assert f["seqs"] == b and f["prefill_tokens"] == b * c and f["decode_tokens"] == 0, (i, f)
            starts.append(i)
            i += decode_steps
        starts.append(i)  # mixed loop
        if bi + 1 < len(batches):
            nb = batches[bi + 1]
            i += 1
            while not (rows[i]["features"]["seqs"] == nb and rows[i]["features"]["prefill_tokens"] == nb * ctxs[0]
                       and rows[i]["features"]["decode_tokens"] == 0 and rows[i + 1]["features"]["decode_tokens"] == nb):
                i += 1
    return starts


def shifted_rows(rows):
    """run33 rows in ``StepAttribution``'s form: ``prefill_step`` says whether the period held an eager launch
    (the next row of the same scenario has a prefill chunk). A launch shows as >= 30 ms; a row under 10 ms
    before a prefill means the pipeline had drained and the prefill was launched by a ``step()`` that resolved
    nothing, which run33 did not record (``StepAttribution`` now carries it)."""
    starts = set(scenario_starts(rows))
    out = []
    for i, r in enumerate(rows):
        feats = [float(r["features"].get(f, 0.0)) for f in FEATURES]
        nxt = rows[i + 1]["features"] if i + 1 < len(rows) and i + 1 not in starts else None
        launched_here = nxt is not None and nxt.get("prefill_tokens", 0) > 0 and r["seconds"] > 0.010
        feats[PSTEP] = 1.0 if launched_here else 0.0
        out.append((tuple(feats), float(r["seconds"])))
    return out


def main(argv):
    src = argv[1] if len(argv) > 1 else "benchmarks/results/run33/steps_h200_8b.jsonl.gz"
    raw = load(src)
    rows = shifted_rows(raw)
    cost, err = fit_rows(rows, async_steps=True)
    # drained launches were not recorded: estimate their per-step extra from the time run33 lost (probe_seconds
    # less the rows' sum) over their number (scenario starts + prefills after a drained pipeline)
    cal_path = src.replace("steps_", "calib_").replace(".jsonl.gz", ".json")
    probe_s = Calibration.load(cal_path).extra["probe_seconds"]
    starts = set(scenario_starts(raw))
    n_drained = len(starts) + sum(
        1 for i, r in enumerate(raw[:-1]) if i + 1 not in starts and raw[i + 1]["features"]["prefill_tokens"] > 0
        and r["seconds"] <= 0.010)
    lost = probe_s - sum(r["seconds"] for r in raw)
    est = max(0.0, lost / n_drained - cost.c0 - cost.coef["prefill_step"])
    cost.coef["drained_prefill"] = est
    print(f"  lost {lost:.3f} s over {n_drained} drained launches -> drained_prefill ~{est * 1e3:.1f} ms (estimate)")
    x = np.array([f for f, _ in rows])
    y = np.array([s for _, s in rows])
    print(f"  measured {y.sum():.3f} s over {len(rows)} rows")
    for name, sel in (("decode rows", x[:, 1] == 0), ("prefill rows", x[:, 1] > 0),
                      ("rows with an eager launch", x[:, PSTEP] == 1)):
        print(f"  {name:<26} {int(sel.sum()):>4}")
    terms = ", ".join(f"{k} {v:.3g}" for k, v in cost.coef.items() if v)
    print(f"refit {len(rows)} steps (mean |error| {err * 100:.1f}%, async_steps, no trimming): step = {cost.c0 * 1e3:.3f} ms + [{terms}] s")
    if len(argv) > 2:
        cal = Calibration.load(cal_path)
        cal.cost, cal.fit_error, cal.source = cost, err, f"refit_run33:{src}"
        cal.save(argv[2])
        print(f"-> {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
