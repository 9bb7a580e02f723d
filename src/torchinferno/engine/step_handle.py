"""``StepHandle``: the host side of one launched runner step (async scheduling).

``ModelRunner.execute_async`` launches a step's device work (forward, sampling, logprobs) and
returns a handle; ``result()`` turns the step's sampled tokens (and logprobs) into a
``ModelRunnerOutput``. On CUDA the handle starts non-blocking device-to-host copies of those
tensors into pinned host buffers and records one event after them on the current stream, so
launching never waits for the device; ``result()`` waits for that event only. On CPU the step
is computed at launch and ``result()`` just converts.

Invariants: the host buffers are read only after the event completed; they are private to the
handle (fresh allocations of PyTorch's caching host allocator, which hands a block out again
only after the copies recorded on it finished). ``result()`` is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchinferno.engine.outputs import ModelRunnerOutput, TokenLogprob

__all__ = ["LogprobRows", "StepHandle"]


@dataclass
class LogprobRows:
    """Logprobs of some sampling rows: ``rows[m]`` indexes the handle's ``request_ids``."""

    rows: list[int]
    ks: list[int]  # top-k wanted by each of those rows
    chosen: torch.Tensor  # [M] fp32
    top_ids: torch.Tensor  # [M, k] int64
    top_logprobs: torch.Tensor  # [M, k] fp32


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class StepHandle:
    """Sampled tokens of one launched step; ``result()`` waits for them (module docstring).

    ``request_ids[n]`` sampled ``tokens[n]`` (a device or host ``[N]`` int64 tensor).
    """

    def __init__(self, request_ids: list[str] | None = None, tokens: torch.Tensor | None = None,
                 logprobs: LogprobRows | None = None):
        self.request_ids = request_ids or []
        self.prompt_logprobs: dict[str, list[TokenLogprob]] = {}  # host values, set by the runner after launch
        self._out: ModelRunnerOutput | None = None
        self._event = None
        self._lp = logprobs
        if tokens is None:
            self._out = ModelRunnerOutput()
            self._host: list[torch.Tensor] = []
            return
        parts = [tokens]
        if logprobs is not None:
            parts += [logprobs.chosen, logprobs.top_ids, logprobs.top_logprobs]
        self._host = [_to_host(t) for t in parts]
        if tokens.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(tokens.device))

    @classmethod
    def empty(cls) -> StepHandle:
        """A step that sampled nothing."""
        return cls()

    def ready(self) -> bool:
        """The results are on the host (``result()`` will not wait)."""
        return self._out is not None or self._event is None or self._event.query()

    def result(self) -> ModelRunnerOutput:
        if self._out is not None:
            self._out.prompt_logprobs = self.prompt_logprobs
            return self._out
        if self._event is not None:
            self._event.synchronize()
        tokens = self._host[0].tolist()
        out = ModelRunnerOutput(sampled_token_ids=dict(zip(self.request_ids, tokens)))
        lp = self._lp
        if lp is not None:
            chosen, top_ids, top_lp = (t.tolist() for t in self._host[1:])
            for m, (j, k) in enumerate(zip(lp.rows, lp.ks)):
                out.logprobs[self.request_ids[j]] = TokenLogprob(tokens[j], chosen[m], top_ids[m][:k], top_lp[m][:k])
        out.prompt_logprobs = self.prompt_logprobs
        self._out = out
        self._host, self._lp = [], None
        return out
