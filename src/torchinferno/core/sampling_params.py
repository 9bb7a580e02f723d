"""Sampling parameters shared by generation, the engine and the server."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torchinferno.errors import SamplingError


@dataclass
class SamplingParams:
    """How to pick the next tokens of one request.

    Invariants (checked by :meth:`validate`): ``temperature >= 0`` (0 means greedy),
    ``top_k`` is ``-1``/``0`` (off) or positive, ``0 < top_p <= 1``, ``0 <= min_p <= 1``,
    ``max_tokens >= 1``. Stop strings are never part of the returned text.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    # Logprobs of the prompt's tokens 1.. (each given the tokens before it) with this many alternatives;
    # such a request never reuses cached prefix blocks (their logits are not computed).
    prompt_logprobs: int | None = None
    priority: int = 0  # lower is served first under EngineConfig(scheduling_policy="priority"); ignored otherwise

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self, max_tokens_limit: int | None = None) -> "SamplingParams":
        def bad(msg: str) -> SamplingError:
            return SamplingError(msg)

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if max_tokens_limit is not None and self.max_tokens > max_tokens_limit:
            raise bad(f"max_tokens={self.max_tokens} exceeds the limit {max_tokens_limit}")
        for name in ("temperature", "top_p", "min_p"):
            v = getattr(self, name)
            if isinstance(v, float) and not math.isfinite(v):
                raise bad(f"{name} must be a finite number, got {v!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise bad(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or (self.top_k < -1):
            raise bad(f"top_k must be -1 (off) or a positive integer, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or not (0.0 <= self.min_p <= 1.0):
            raise bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise bad(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise bad(f"priority must be an integer, got {self.priority!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise bad(f"n must be an integer >= 1, got {self.n!r}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise bad("stop must be a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids must be non-negative integers")
        return self
