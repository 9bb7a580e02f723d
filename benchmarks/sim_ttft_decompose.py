"""Where a request's TTFT goes, measured vs simulated (issue 21): per request, from a served run's step log and
bench-serve results, and from the simulator's own trace of the same requests (arrivals replayed from the step log).

Components (seconds; the core's clock for the measured side, the virtual clock for the simulated side):

* ``api``: client TTFT less the core's part: admission (HTTP, tokenization, the hop to the core) and the first
  token's way back to the client (the measured side cannot tell the two apart; the simulated side's admission is
  the replayed one, its way back the API stage's ``stream_s``);
* ``sched_wait``: arrival at the core -> the start of the loop iteration that launched its first prefill chunk;
* ``prefill``: that start -> the end of the iteration that launched its last chunk (launch host time, the wait for
  the previous batch's result and its apply);
* ``first_tok``: the end of that iteration -> the end of the iteration that took the last chunk's result (the loop's
  gap, the next batch's launch, the wait for the prefill's device end, its apply: under async scheduling the first
  token leaves one iteration after its prefill was launched). Simulated only: ``ft_host`` (the host launch of the
  batch that iteration launched, the timeline's ``pre + launch``) and ``ft_wait`` (the rest).

Requests are followed by counts, as ``sim.arrival_replay`` does (no request ids in a step log): arrivals in order,
first chunks scheduled first come first served, a prompt cut by the token budget continuing in the next batch's
first prefill row. Exact without preemption.

    PYTHONPATH=src python3 benchmarks/sim_ttft_decompose.py benchmarks/results/run45 --fit a --predict b --levels 1 16 64

``--anchor-device`` / ``--fix NAME=S,...`` pass the timeline fit's options (``sim.timeline_fit.fit_timeline``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from torchinferno.sim.first_token import CoreRequest, follow_requests

COMPONENTS = ("ttft", "api", "sched_wait", "prefill", "first_tok")


def components(req: CoreRequest, ttft: float) -> dict:
    core = req.first_token - req.arrival
    return {"ttft": ttft, "api": ttft - core, "sched_wait": req.first_sched - req.arrival,
            "prefill": req.prefill_end - req.first_sched, "first_tok": req.first_token - req.prefill_end}


def level_name(doc: dict) -> str:
    """A bench-serve result's level: its concurrency cap (closed loop, e.g. ``16``), else ``r`` and its request rate
    (a Poisson level, e.g. ``r8``)."""
    rate = doc.get("request_rate")
    if doc.get("max_concurrency") is None and rate not in (None, "inf") and float(rate) != float("inf"):
        return f"r{float(rate):g}"
    return str(doc.get("max_concurrency"))


def measured_levels(step_log: str, results: list[str], warmups: int | None = None) -> dict:
    """Per result (run order): a list of per-request component dicts of the measured run."""
    from torchinferno.sim.arrival_replay import level_warmups
    from torchinferno.sim.step_log_fit import read_step_log

    meta, rows = read_step_log(step_log, for_fit=False)
    reqs = follow_requests(rows, int(meta.get("max_num_batched_tokens") or 0))
    out, pos = {}, 0
    for path in results:
        doc = json.loads(Path(path).read_text())
        w, n = level_warmups(doc, warmups), int(doc.get("completed") or len(doc["input_lens"]))
        level = reqs[pos + w:pos + w + n]
        pos += w + n
        ttfts = doc.get("ttfts") or [float("nan")] * n  # older results (run 37) keep no per-request TTFTs
        out[level_name(doc)] = [components(q, t) for q, t in zip(level, ttfts)]
    if pos != len(reqs):
        raise SystemExit(f"{step_log}: {len(reqs)} requests, results account for {pos}")
    return out


class SimTrace:
    """Step-log-shaped rows of a simulated replica (exact arrival times, launched/resolved ids, the timeline's host
    launch of each launched batch)."""

    def __init__(self, replica, model):
        from dataclasses import asdict

        from torchinferno.sim.timeline import TimelineModel, batch_shape

        self.rows: list[dict] = []
        core = replica.core
        core.record_shapes = True
        add, arrived = replica.add, []
        timeline = isinstance(model, TimelineModel)
        sched_of = {}
        orig_schedule = core._schedule

        def schedule():
            s = orig_schedule()
            sched_of["last"] = s
            return s

        core._schedule = schedule

        def counting_add(rid, prompt, max_tokens, t, external=False):
            idle = not replica.has_work()
            add(rid, prompt, max_tokens, t, external)
            arrived.append((t, idle))

        def hook(t0, t1):
            row = {"t": t0, "dt": t1 - t0, "gap": 0.0, "idle": 1e-6 if any(i for _, i in arrived) else 0.0,
                   "arrival_times": [t for t, _ in arrived], "step": core.last_launched, "resolved": core.last_resolved}
            if core.last_shape is not None and core.last_launched is not None:
                row.update(asdict(core.last_shape))
                if timeline:
                    pre, launch, _, _ = model.parts(batch_shape(sched_of["last"], replica.external_prefill or set()))
                    row["host_launch"] = pre + launch
            self.rows.append(row)
            core.last_shape = None
            arrived.clear()

        replica.add = counting_add
        replica.step_hook = hook


def simulated_levels(cal, results: list[str], step_log: str, stream_s: float, cost_model: str = "auto") -> dict:
    """Per result: per-request component dicts of the simulator replaying ``results`` with the arrivals of
    ``step_log`` (the run that produced them)."""
    from torchinferno.sim.validate import _served_workload, replayed_delays, served_run

    work = [_served_workload(p, 0) for p in results]
    delays = replayed_delays(step_log, work)
    out = {}
    for (doc, reqs), dl in zip(work, delays):
        traces = []

        def hook(rep):
            traces.append(SimTrace(rep, cal.model_for(cost_model)))

        res = served_run(cal, doc, reqs, 0.0, cost_model, stream_s, dl, replica_hook=hook)
        budget = int(cal.extra["engine_limits"]["max_num_batched_tokens"] or 0)
        core_reqs = follow_requests(traces[0].rows, budget)
        recs = sorted(res.records, key=lambda r: r.entry_s)
        level = []
        for q, rec in zip(core_reqs, recs):
            c = components(q, rec.first_s - rec.send_s)
            ft = q.extra.get("ft_row", {})
            if "host_launch" in ft:
                c["ft_host"] = ft["host_launch"]
                c["ft_wait"] = c["first_tok"] - c["ft_host"]
            level.append(c)
        out[level_name(doc)] = level
    return out


def _med(xs: list[dict], k: str) -> float:
    v = [x[k] for x in xs if k in x and x[k] == x[k]]
    return statistics.median(v) if v else float("nan")


def table(measured: dict, simulated: dict, levels: list[str]) -> str:
    keys = COMPONENTS + ("ft_host", "ft_wait")
    lines = [f"{'C':>4} {'':<9} " + " ".join(f"{k:>10}" for k in keys)]
    for c in levels:
        m, s = measured[c], simulated[c]
        lines.append(f"{c:>4} {'measured':<9} " + " ".join(f"{_med(m, k) * 1e3:10.2f}" for k in keys))
        lines.append(f"{'':>4} {'simulated':<9} " + " ".join(f"{_med(s, k) * 1e3:10.2f}" for k in keys))
        lines.append(f"{'':>4} {'delta':<9} " + " ".join(f"{(_med(s, k) - _med(m, k)) * 1e3:+10.2f}" for k in keys))
    return "\n".join(lines) + "\n(medians over the level's requests, ms; each column's median on its own)"


def main(argv=None) -> int:
    from sim_offline_validate import _files

    from torchinferno.sim.step_log_fit import calibration_from_step_logs
    from torchinferno.sim.validate import fit_stream_replay

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="directory with steps_{a,b}.jsonl[.gz] and bench_{a,b}_{c,r}*.json")
    p.add_argument("--fit", default="a", help="run whose step log calibrates (a or b)")
    p.add_argument("--predict", default="b", help="run whose requests are simulated and compared")
    p.add_argument("--levels", nargs="*", default=None,
                   help="levels to print: concurrencies, r<rate> for Poisson levels (default: all)")
    p.add_argument("--cost-model", default="timeline", choices=["timeline", "linear"])
    p.add_argument("--anchor-device", action="store_true", help="fit_timeline(anchor=True)")
    p.add_argument("--device-bound-graphs", action="store_true", help="fit_timeline(device_bound_graphs=True)")
    p.add_argument("--fix", default=None, metavar="NAME=SECONDS,...", help="fit_timeline(fixed=...)")
    p.add_argument("--calibration", default=None, help="a saved calibration instead of fitting (skips --fit)")
    p.add_argument("--save-calibration", default=None)
    p.add_argument("--json-output", default=None)
    a = p.parse_args(argv)
    run = Path(a.run)

    def files(name):  # every level in run order: closed loops, then Poisson rates (sim_offline_validate's)
        got = _files(run, name)
        if got is None:
            raise SystemExit(f"{run}: no steps_{name}.jsonl[.gz]")
        return str(got[0]), got[1]

    (fs, fb), (ps, pb) = files(a.fit), files(a.predict)
    if a.calibration:
        from torchinferno.sim.calibration import Calibration

        cal = Calibration.load(a.calibration)
    else:
        tf = {"anchor": a.anchor_device, "device_bound_graphs": a.device_bound_graphs}
        if a.fix:
            tf["fixed"] = {k: float(v) for k, v in (kv.split("=") for kv in a.fix.split(","))}
        cal = calibration_from_step_logs([fs], log=lambda *x: None, cost_model=a.cost_model, timeline_fit=tf)
        cal.extra["stream_s"], _ = fit_stream_replay(cal, fb, fs, cost_model=a.cost_model)
        if a.save_calibration:
            cal.save(a.save_calibration)
    measured = measured_levels(ps, pb)
    simulated = simulated_levels(cal, pb, ps, cal.extra.get("stream_s", 0.0), a.cost_model)
    levels = a.levels or list(measured)
    print(f"{run}: fit on {a.fit}, predicting {a.predict} (arrivals replayed; stream_s "
          f"{cal.extra.get('stream_s', 0.0) * 1e6:.0f} us)")
    print(table(measured, simulated, levels))
    if a.json_output:
        Path(a.json_output).write_text(json.dumps({"measured": measured, "simulated": simulated,
                                                   "timeline": cal.timeline}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
