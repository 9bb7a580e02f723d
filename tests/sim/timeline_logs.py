"""Synthetic engine-loop logs for the timeline-fit tests: an async engine's iterations under a known
:class:`~torchinferno.sim.timeline.TimelineModel` (shared by test_timeline.py and test_timeline_anchor.py); and
:func:`one_second_steps`, the driver tests' toy served run."""

from __future__ import annotations

import random

from torchinferno.sim.timeline import BatchShape, Timeline, TimelineModel
from torchinferno.sim.timeline_fit import Iteration


def dec(rows, ctx=200):
    """A decode batch of ``rows`` rows, each over ``ctx`` tokens."""
    return BatchShape(rows, rows, rows, 0, rows * ctx, ctx, 0.0)


def pre(tokens, rows=1, decode_rows=0):
    """``rows`` fresh prompts of ``tokens`` tokens in all beside ``decode_rows`` decodes over 200 tokens each."""
    return BatchShape(rows + decode_rows, tokens + decode_rows, decode_rows, tokens, decode_rows * 200,
                      200 if decode_rows else 0, tokens * tokens / rows * 0.5e-3)


def one_second_steps(requests: int, output_len: int, **workload) -> list:
    """``driver.run_workload``'s records for ``requests`` 8-token prompts sent at 0 s, each decoding ``output_len``
    tokens, on one replica whose every step takes exactly 1 s (``workload``: the API stage, concurrency, ...)."""
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.core import EngineCore
    from torchinferno.sim.cost_model import CostModel
    from torchinferno.sim.driver import Replica, run_workload
    from torchinferno.sim.executor import SimulatedExecutor
    from torchinferno.sim.traffic import SimRequest

    ex = SimulatedExecutor(CostModel(c0=1.0), EngineConfig(max_num_seqs=8, max_num_batched_tokens=256),
                           num_blocks=64, device="cpu")
    reqs = [SimRequest(f"r{i}", 0.0, list(range(1, 9)), output_len) for i in range(requests)]
    return run_workload(reqs, [Replica(EngineCore(ex), ex.clock)], **workload).records


class EngineLoop:
    """Iterations of one async loop: :meth:`burst` launches shapes back to back (each iteration resolves the
    previous launch; a busy gap of ``gap_ms`` before every step), then one closing iteration drains it. Each
    iteration carries its launch and wait times, as a version-3 step log does (``split``: False leaves them out)."""

    def __init__(self, model: TimelineModel, rng: random.Random, split: bool = True):
        self.model, self.rng, self.t, self.split = model, rng, Timeline(model), split
        self.its: list[Iteration] = []
        self.now, self.step, self.prev = 0.0, 0, None

    def idle(self, seconds: float) -> None:
        self.now += seconds

    def burst(self, shapes, gap_ms: tuple[float, float]) -> None:
        t, dev_end = self.t, None
        for shape in [*shapes, None]:
            start = self.now
            end = t.launch(start, shape) if shape is not None else start + self.model.params["host_step"]
            launched = None
            if shape is not None:
                self.step += 1
                launched = (0, self.step)
                dev_end = t.last_device_end
            launch, wait = end - start, None
            if self.prev is not None:
                wait = max(0.0, self.prev[1] - end)
                end = t.resolve(end, self.prev[1], self.prev[2])
            if not self.split:
                launch = wait = None
            self.its.append(Iteration(start, end, launched, shape, self.prev[0] if self.prev else None, launch, wait))
            self.prev = (launched, dev_end, shape) if shape is not None else None
            self.now = end + self.rng.uniform(*gap_ms) * 1e-3
