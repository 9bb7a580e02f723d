"""``--step-log FILE``: one JSON line per engine-core step, for diagnosing a server and calibrating the simulator.

Each line: ``t`` (seconds since the log opened, at the step's start), ``dt`` (seconds the step took on the core's
host thread: with async scheduling that is launch of step k + apply of step k-1), ``seqs`` / ``tokens`` (the
scheduled batch), ``decode_seqs`` / ``prefill_tokens`` (its split), ``running`` / ``waiting`` (scheduler queues
after scheduling), ``outputs`` (requests that got tokens back) and ``gap`` (seconds the loop spent outside
steps since the previous one: receiving messages, encoding and sending outputs).

Written by the engine-core process only when asked for; the hot loop pays one ``perf_counter`` pair and a
buffered write per step.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from torchinferno.engine.outputs import SchedulerOutput

__all__ = ["StepShape", "step_shape", "StepLog"]


@dataclass(frozen=True)
class StepShape:
    """The shape of one scheduled batch (what a step cost depends on)."""

    seqs: int
    tokens: int
    decode_seqs: int
    prefill_tokens: int
    running: int
    waiting: int


def step_shape(sched: SchedulerOutput, running: int, waiting: int) -> StepShape:
    """Split a batch into decodes (one token past a computed prefix) and prefill chunks."""
    dec = pre = tok = 0
    for s in sched.scheduled:
        n = len(s.token_ids)
        tok += n
        if n == 1 and s.num_computed_tokens > 0:
            dec += 1
        else:
            pre += n
    return StepShape(len(sched.scheduled), tok, dec, pre, running, waiting)


class StepLog:
    """Append-only JSONL writer; ``record`` takes a step's start time, duration and shape."""

    def __init__(self, path: str):
        self._f = open(path, "w", buffering=1 << 16)
        self._t0 = time.perf_counter()
        self._last_end: float | None = None

    def record(self, start: float, end: float, shape: StepShape | None, outputs: int) -> None:
        row = {"t": round(start - self._t0, 6), "dt": round(end - start, 6),
               "gap": None if self._last_end is None else round(start - self._last_end, 6), "outputs": outputs}
        row.update(asdict(shape) if shape is not None else {})
        self._f.write(json.dumps(row) + "\n")
        self._last_end = end

    def close(self) -> None:
        self._f.close()
