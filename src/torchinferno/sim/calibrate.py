"""``sim-calibrate``: time real engine steps at a grid of shapes and fit a ``CostModel``.

Probes run the real ``EngineCore`` (the model, its runner, the scheduler) and time every whole
``step()``: for each batch size B and context C of the grid, B requests of C prompt tokens are submitted
together and generate ``decode_steps`` tokens, which yields prefill steps (chunked to the step token budget,
with mixed prefill+decode rows when chunks interleave) and decode steps of B rows over ~C context. One
warm-up scenario runs first and is discarded. Each measured step gives ``(step_features, seconds)``; the
rows can be written as JSONL (``--steps-out``) and re-fitted later (``--from-steps``) without the model.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.engine.executor import Executor, UniprocExecutor
from torchinferno.errors import ConfigError
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.cost_model import FEATURES, fit, step_features

PREFILL_STEP = FEATURES.index("prefill_step")
from torchinferno.sim.driver import Replica, run_workload
from torchinferno.sim.executor import make_clock
from torchinferno.sim.traffic import SimRequest

__all__ = ["ProbeGrid", "RecordingExecutor", "StepAttribution", "calibrate_model", "fit_rows", "read_steps", "rows_from_bench_generate", "time_steps",
           "write_steps"]


@dataclass
class ProbeGrid:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    context_lens: tuple[int, ...] = (32, 256, 768)
    decode_steps: int = 16
    mixed: bool = True  # also a closed loop of mixed lengths per batch size (prefill chunks among decodes)
    seed: int = 0
    clock: str = "wall"  # "wall" | "cpu" (CPU time of this process: a single-threaded engine on a shared host)


class _Resolving:
    """A step handle that records which step's result was taken (async scheduling takes step k-1's in step k)."""

    def __init__(self, rec, sched, handle):
        self.rec, self.sched, self.handle = rec, sched, handle

    def result(self):
        self.rec.resolved = self.sched
        return self.handle.result()

    def ready(self) -> bool:
        return self.handle.ready()


class RecordingExecutor(Executor):
    """Delegates to ``inner``; ``last`` is the last launched ``SchedulerOutput``, ``resolved`` the last one whose
    result the core took (the same step in the synchronous engine; the previous one with async scheduling):
    ``StepAttribution`` turns them and the step times into rows."""

    def __init__(self, inner: Executor):
        self.inner = inner
        self.config, self.max_model_len = inner.config, inner.max_model_len
        self.num_blocks, self.block_size = inner.num_blocks, inner.block_size
        self.prefill_graph_tokens = inner.prefill_graph_tokens
        self.piecewise_graph_tokens = inner.piecewise_graph_tokens
        self.mixed_graph_mode = inner.mixed_graph_mode
        self.last = self.resolved = None

    def execute_async(self, sched):
        self.last = sched
        return _Resolving(self, sched, self.inner.execute_async(sched))

    @property
    def num_forward_calls(self) -> int:
        return self.inner.num_forward_calls

    def describe(self) -> str:
        return self.inner.describe()


class StepAttribution:
    """Charges the wall time of timed ``step()`` calls to the ``SchedulerOutput``s they resolved, so that the
    sum of the charges is the time the engine spent (what the simulator's clock must add up to).

    A ``step()``'s period (previous ``step()``'s end to its end: driver bookkeeping included) is charged to
    the step whose result it took; the period of a ``step()`` that took none (the first of a burst, which
    only launches) is carried into the next charge. Synchronous engine: the step launched and resolved are
    the same. Async scheduling (CUDA): ``step()`` k launches k, then waits for k-1; the launch of an eager
    step (one with a prefill chunk: ~35-100 ms on an H200 for an 8B model, against ~0.3 ms for a CUDA-graph
    decode) lands in k-1's charge. So the row's ``prefill_step`` feature says whether the step *launched* in
    that period was eager; ``fit(..., async_steps=True)`` maps this back to a per-step cost (see ``fit``).
    A step launched by a ``step()`` that resolved nothing carries ``drained_prefill`` (when it has a prefill
    chunk); its row holds that launch. run33 charged the period alone and dropped the carried part: prefills looked ~1 ms, decodes before a
    prefill ~40 ms, and the fit was off by 52%.
    """

    def __init__(self):
        self.prev_end: float | None = None
        self.carry = 0.0
        self.drained: set[int] = set()  # id of steps launched by a step() that resolved nothing

    def step(self, t0: float, t1: float, launched, resolved) -> tuple | None:
        """``(features, seconds)`` for this ``step()``, or None when it resolved nothing."""
        start = self.prev_end if self.prev_end is not None else t0
        self.prev_end = t1
        if resolved is None:
            self.carry += t1 - start
            if launched is not None:
                self.drained.add(id(launched))
            return None
        seconds, self.carry = self.carry + (t1 - start), 0.0
        drained = id(resolved) in self.drained
        self.drained.discard(id(resolved))
        feats = list(step_features(resolved, drained=drained))
        feats[PREFILL_STEP] = step_features(launched)[PREFILL_STEP] if launched is not None else 0.0
        return tuple(feats), seconds


def time_steps(core: EngineCore, rec: RecordingExecutor, batch: int, ctx: int, new_tokens: int,
               rng: random.Random, vocab: int, tag: str, mixed: bool = False,
               clock: str = "wall") -> list[tuple[tuple, float]]:
    """Serve ``batch`` requests of ``ctx`` prompt tokens through the simulator's own driver loop on a wall
    clock; one ``(features, seconds)`` per resolved step (``StepAttribution``: the step period, the engine
    step plus the driver's bookkeeping, which a simulated step must also cover)."""
    if mixed:  # a closed loop of 3 x batch requests, at most batch in flight: prefills join running decodes
        reqs = [SimRequest(f"{tag}-{i}", 0.0, [rng.randrange(vocab) for _ in range(rng.randint(8, ctx))],
                           rng.randint(2, 2 * new_tokens)) for i in range(3 * batch)]
    else:
        reqs = [SimRequest(f"{tag}-{i}", 0.0, [rng.randrange(vocab) for _ in range(ctx)], new_tokens)
                for i in range(batch)]
    rows: list[tuple[tuple, float]] = []
    att = StepAttribution()

    def hook(t0: float, t1: float) -> None:
        launched = rec.last if rec.last is not None and rec.last.scheduled else None
        resolved = rec.resolved if rec.resolved is not None and rec.resolved.scheduled else None
        rec.last = rec.resolved = None
        got = att.step(t0, t1, launched, resolved)
        if got is not None:
            rows.append(got)

    rep = Replica(core, make_clock(clock), "probe")
    rep.step_hook = hook
    run_workload(reqs, [rep], max_concurrency=batch)
    core.reset_prefix_cache()  # the next scenario must not hit this one's blocks
    return rows


def fit_rows(rows, knees=None, async_steps: bool = False, trim: float | None = None, weights: str = "relative"):
    """``fit`` with knee candidates at token quartiles. ``trim`` (default: 3 for a synchronous engine, off
    with ``async_steps``): on CUDA the slow steps are eager launches, real costs, not interference."""
    tokens = sorted({f[1] + f[2] for f, _ in rows})
    if knees is None:
        knees = (0.0,) + tuple(float(tokens[int(q * (len(tokens) - 1))]) for q in (0.25, 0.5, 0.75))
    if trim is None:
        trim = 0.0 if async_steps else 3.0
    return fit(rows, knees=knees, trim=trim, async_steps=async_steps, weights=weights)


def calibrate_model(model, config: EngineConfig, grid: ProbeGrid, log=print,
                    weights: str = "relative") -> tuple[Calibration, list]:
    """Probe ``model`` through the real engine (module docstring); returns the calibration and the raw rows."""
    cfg = config  # the engine as it will serve (prefix caching included: probes use fresh random prompts)
    rec = RecordingExecutor(UniprocExecutor(model, cfg))
    core = EngineCore(rec, (), getattr(model.config, "vocab_size", None))
    vocab = getattr(model.config, "vocab_size", 1000) or 1000
    cap = core.max_model_len - 2 * grid.decode_steps  # mixed probes generate up to 2 x decode_steps tokens
    if cap < 8:
        raise ConfigError(f"max_model_len {core.max_model_len} leaves no room for probes of {grid.decode_steps} "
                          "decode steps (lower --decode-steps or raise --max-model-len)")
    if max(grid.context_lens) > cap:
        clipped = tuple(sorted({min(c, cap) for c in grid.context_lens}))
        log(f"sim-calibrate: probe contexts {list(grid.context_lens)} clipped to {list(clipped)} "
            f"(max_model_len {core.max_model_len})")
        grid = replace(grid, context_lens=clipped)
    rng = random.Random(grid.seed)
    time_steps(core, rec, 2, min(64, max(grid.context_lens)), 4, rng, vocab, "warmup", clock=grid.clock)
    rows = []
    t0 = time.perf_counter()
    for b in grid.batch_sizes:
        for c in grid.context_lens:
            got = time_steps(core, rec, b, c, grid.decode_steps, rng, vocab, f"b{b}c{c}", clock=grid.clock)
            rows.extend(got)
            log(f"sim-calibrate: batch {b:>3} context {c:>5}: {len(got)} steps, "
                f"median {sorted(s for _, s in got)[len(got) // 2] * 1e3:.2f} ms")
        if grid.mixed:
            got = time_steps(core, rec, b, max(grid.context_lens), grid.decode_steps, rng, vocab, f"mix{b}", True,
                             clock=grid.clock)
            rows.extend(got)
            log(f"sim-calibrate: batch {b:>3} mixed closed loop: {len(got)} steps")
    async_steps = bool(rec.config.async_scheduling)
    cost, err = fit_rows(rows, async_steps=async_steps, weights=weights)
    kv = rec.inner.kv_cache
    mcfg = model.config
    cal = Calibration(
        cost=cost, model=getattr(model, "name_or_path", None) or type(model).__name__,
        device=str(rec.inner.device), dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        kv_dtype=str(kv.dtype).removeprefix("torch."), kv_bytes_per_elem=kv.dtype.itemsize,
        num_layers=int(getattr(mcfg, "num_hidden_layers", 0) or 0), hidden_size=int(getattr(mcfg, "hidden_size", 0) or 0),
        kv_bytes_per_token=int(kv.bytes_per_token), num_samples=len(rows), fit_error=err, source="probes",
        extra={"clock": grid.clock, "async_scheduling": async_steps, "probe_seconds": time.perf_counter() - t0, "grid": dict(grid.__dict__),
               "block_size": cfg.block_size, "max_num_batched_tokens": rec.config.max_num_batched_tokens},
    )
    return cal, rows


def write_steps(rows, path: str | Path) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps({"features": dict(zip(FEATURES, feats)), "seconds": s}) + "\n" for feats, s in rows)


def read_steps(path: str | Path) -> list[tuple[tuple, float]]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"steps file not found: {p}")
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            rows.append((tuple(float(d["features"].get(f, 0.0)) for f in FEATURES), float(d["seconds"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"{p}:{n}: expected {{\"features\": {{...}}, \"seconds\": S}}") from None
    return rows


def rows_from_bench_generate(path: str | Path, prompt_tokens: int, new_tokens: int) -> list[tuple[tuple, float]]:
    """Decode-step rows from a ``bench-generate --json-output`` report: batch B at ``ours_tok_s`` is a decode
    step of B rows over ``prompt_tokens + new_tokens / 2`` context taking ``B / ours_tok_s`` seconds. That
    benchmark runs the static generator (no scheduler), so these rows carry no serving overhead and say
    nothing about prefill: mix them with probe steps (``--from-steps``) rather than fitting on them alone."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"bench-generate report not found: {p}")
    try:
        doc = json.loads(p.read_text())
        bench_rows = [(int(r["batch_size"]), float(r["ours_tok_s"])) for r in doc["rows"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ConfigError(f"{p} is not a bench-generate JSON report (rows of batch_size / ours_tok_s)") from None
    ctx = prompt_tokens + new_tokens / 2
    out = []
    for b, tok_s in bench_rows:
        if tok_s <= 0:
            continue
        out.append(((float(b), 0.0, float(b), b * ctx, 0.0, 0.0, b * ctx), b / tok_s))
    return out
