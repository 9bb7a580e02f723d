"""``--step-log FILE``: one JSON line per engine-core step, for diagnosing a server and calibrating the simulator.

The first line is ``{"meta": {...}}``: the engine's limits and what it runs (async scheduling, block size, KV pool,
model/device/dtype and KV bytes when the executor knows them) — what ``sim-calibrate --from-step-log`` needs to turn
the file into a calibration. Each further line is one step:

* ``t`` (seconds since the log opened, at the step's start), ``dt`` (seconds the step took on the core's host
  thread: with async scheduling that is launch of step k + apply of step k-1);
* ``gap`` (seconds the loop spent outside steps since the previous one: receiving messages, encoding and sending
  outputs) and ``idle`` (the part of ``gap`` spent waiting for a request with nothing to run);
* ``launch`` and ``wait`` (async scheduling; null otherwise): seconds of ``dt`` spent scheduling and launching the
  new batch, and blocked on the previous batch's result (its device work and the copy back). The rest of ``dt``
  applies that result. A ``wait`` well above the copy's ~0.05 ms means the device bound the step: the split tells
  the host's share of a step from the device's, which ``dt`` alone cannot (issue 21);
* ``step`` (index of the batch this call launched, or null) and ``resolved`` (index of the batch whose result it
  applied, or null: async scheduling resolves the previous launch; the synchronous engine its own);
* the launched batch's shape (``StepShape``): ``seqs`` / ``tokens``, ``decode_seqs`` / ``prefill_tokens``,
  ``decode_ctx`` (KV tokens the decode rows read) / ``decode_ctx_max`` (the longest of them), ``prefill_attn``
  (sum over prefill chunks of ``chunk * (start + chunk / 2)`` / 1e3: query x key pairs), ``running`` / ``waiting``
  (scheduler queues after scheduling); ``outputs`` (requests that got tokens back); and ``arrivals`` (new
  requests the loop received since the previous step: when the API server's admissions reached the core, for
  replaying them in the simulator).

Written by the engine-core process only when asked for; the hot loop pays one ``perf_counter`` pair, one pass over
the batch and a buffered write per step.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from torchinferno.engine.outputs import SchedulerOutput

__all__ = ["StepLog", "StepShape", "step_shape"]


@dataclass(frozen=True)
class StepShape:
    """The shape of one scheduled batch (what a step cost depends on)."""

    seqs: int
    tokens: int
    decode_seqs: int
    prefill_tokens: int
    running: int
    waiting: int
    decode_ctx: int = 0
    decode_ctx_max: int = 0
    prefill_attn: float = 0.0


def step_shape(sched: SchedulerOutput, running: int, waiting: int) -> StepShape:
    """Split a batch into decode rows (one sampled token past a computed prefix: the simulator's cost model uses
    the same rule) and prefill chunks."""
    dec = pre = tok = ctx = ctx_max = 0
    attn = 0.0
    for s in sched.scheduled:
        n = len(s.token_ids)
        tok += n
        start = s.num_computed_tokens
        if n == 1 and s.sample and start > 0:
            dec += 1
            ctx += start + 1
            ctx_max = max(ctx_max, start + 1)
        else:
            pre += n
            attn += n * (start + n * 0.5)
    return StepShape(len(sched.scheduled), tok, dec, pre, running, waiting, ctx, ctx_max, round(attn * 1e-3, 3))


class StepLog:
    """Append-only JSONL writer: ``meta`` once, then ``record`` per step."""

    def __init__(self, path: str, meta: dict | None = None):
        self._f = open(path, "w", buffering=1 << 16)
        self._t0 = time.perf_counter()
        self._last_end: float | None = None
        self._f.write(json.dumps({"meta": {"step_log_version": 3, **(meta or {})}}) + "\n")

    def record(self, start: float, end: float, shape: StepShape | None, outputs: int, idle: float = 0.0,
               step: int | None = None, resolved: int | None = None, arrivals: int = 0,
               launch: float | None = None, wait: float | None = None) -> None:
        row = {"t": round(start - self._t0, 6), "dt": round(end - start, 6),
               "gap": None if self._last_end is None else round(start - self._last_end, 6),
               "idle": round(idle, 6), "step": step, "resolved": resolved, "outputs": outputs, "arrivals": arrivals,
               "launch": None if launch is None else round(launch, 6), "wait": None if wait is None else round(wait, 6)}
        row.update(asdict(shape) if shape is not None else {})
        self._f.write(json.dumps(row) + "\n")
        self._last_end = end

    def close(self) -> None:
        self._f.close()


def step_log_meta(core) -> dict:
    """The engine's limits and what it runs, for the log's first line (fields the executor does not know are left out)."""
    cfg, ex = core.config, core.executor
    meta = {"async_scheduling": bool(cfg.async_scheduling), "block_size": core.pool.block_size,
            "num_blocks": core.pool.num_blocks, "max_model_len": core.max_model_len, "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens, "enable_prefix_caching": cfg.enable_prefix_caching,
            "engine": core.describe()}
    # the longest fresh prompt the runner replays from a prefill graph (0: eager prefill), and whether a lone such
    # prompt runs in a step of its own (the scheduler's limit: 0 when not)
    meta["prefill_graph_tokens"] = int(getattr(ex, "prefill_graph_tokens", 0))
    meta["lone_prefill_tokens"] = int(core.scheduler.lone_prefill_tokens)
    # the most tokens any other step runs from piecewise graphs around eager attention (0: such steps eager)
    meta["piecewise_graph_tokens"] = int(getattr(ex, "piecewise_graph_tokens", 0))
    # how they replay: "piecewise" (eager attention between graphs: host-bound), "full" (one graph) or "eager"
    meta["mixed_graph_mode"] = str(getattr(ex, "mixed_graph_mode", "eager"))
    sp = getattr(core, "sliding_pool", None)
    if sp is not None:  # hybrid KV spec: the sliding group's pool and the window the scheduler frees behind
        meta["num_sliding_blocks"], meta["sliding_window"] = sp.num_blocks, ex.sliding_window
    inner = getattr(ex, "inner", ex)  # a recording wrapper delegates to the executor it wraps
    model = getattr(inner, "model", None)
    mcfg = getattr(model, "config", None) or getattr(inner, "model_config", None)
    if mcfg is not None:
        meta["num_layers"] = int(getattr(mcfg, "num_hidden_layers", 0) or 0)
        meta["hidden_size"] = int(getattr(mcfg, "hidden_size", 0) or 0)
    if model is not None:
        meta["model"] = getattr(model, "name_or_path", None) or type(model).__name__
        meta["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    dev = getattr(inner, "device", None)
    if dev is not None:
        meta["device"] = str(dev)
    kv = getattr(inner, "kv_cache", None)
    if kv is not None:
        meta["kv_dtype"] = str(kv.dtype).removeprefix("torch.")
        meta["kv_bytes_per_elem"] = kv.dtype.itemsize
        meta["kv_bytes_per_token"] = int(kv.bytes_per_token)
    return meta
