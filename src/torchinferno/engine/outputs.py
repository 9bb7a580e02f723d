"""Plain data passed between scheduler, model runner and engine, and returned to callers.

``SchedulerOutput`` (scheduler -> runner) and ``ModelRunnerOutput`` (runner -> scheduler) hold
no references to live ``Request`` objects, so the runner cannot change request state and either
side could move to another process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from torchinferno.core.sampling_params import SamplingParams

__all__ = ["PLACEHOLDER_TOKEN", "ScheduledRequest", "SchedulerOutput", "TokenLogprob", "ModelRunnerOutput",
           "RequestOutput"]

# Stands for a token sampled by the step still in flight (async scheduling): the host does not know
# it yet, so the runner fills it on the device from that step's sampled tokens. Never a valid id.
PLACEHOLDER_TOKEN = -1


@dataclass
class ScheduledRequest:
    """One request's work in a step: compute ``token_ids`` at positions ``num_computed_tokens ...``.

    Built positionally once per request per step (``Scheduler._scheduled``): add fields at the end.

    ``block_ids`` is the request's whole block table (covers ``num_computed_tokens +
    len(token_ids)`` tokens); ``sample`` is True when this step reaches the end of the request's
    tokens, so the runner samples the next one from the last position.

    Async scheduling: the last entry of ``token_ids`` may be ``PLACEHOLDER_TOKEN`` (then it is the
    only entry, a decode): the token the previous step sampled for this request, which the runner
    takes from that step's device tensor. ``arrival_index`` identifies the scheduled request
    (request ids can be reused once a request finished, while its last step is still in flight).
    """

    request_id: str
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]
    new_block_ids: list[int]
    sample: bool
    sampling_params: SamplingParams
    arrival_index: int = -1  # Request.arrival_index of the scheduled request
    # prompt_logprobs requests: logprobs of these prompt tokens are computed at the chunk's positions
    # prompt_logprob_start.. (absolute positions; target i is the prompt token at prompt_logprob_start + i + 1)
    prompt_logprob_start: int = 0
    prompt_logprob_targets: list[int] | None = None
    prior_draws: int = 0  # seeded draws made elsewhere before this request's first step here (disaggregation)
    # Hybrid KV specs: the sliding group's table, parallel to ``block_ids`` (one block per ``block_size`` tokens;
    # entries before the window are -1 placeholders, never read); its new blocks are the last len(new_block_ids)
    sliding_block_ids: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    """Everything one forward needs, in batch order (decodes first, then prefill chunks)."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # finished/aborted since the last step

    @property
    def total_num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)


@dataclass
class TokenLogprob:
    """Log-probability (raw model distribution) of a sampled token and the top alternatives."""

    token_id: int
    logprob: float
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass
class ModelRunnerOutput:
    """Sampled tokens of the requests that sampled this step (by request id)."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)  # of prompt tokens, this step's


@dataclass
class RequestOutput:
    """What the engine reports for one request after a step (a streaming delta + totals).

    Built positionally once per request per step (``RequestTextState.make_output``): add fields at the end.
    """

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    text: str  # cumulative text (stop strings excluded)
    token_ids: list[int]  # cumulative generated ids (a stop token id is included, as in generate.py)
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" once finished
    prompt_tokens: int
    completion_tokens: int
    stop_reason: int | str | None = None  # the stop token id, "stop_string", or None
    logprobs: list[TokenLogprob] | None = None  # for new_token_ids, when requested
    num_cached_tokens: int = 0
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # prompt tokens 1.. (first output, when requested)

    def merged_with(self, later: "RequestOutput") -> "RequestOutput":
        """One output equal to streaming ``self`` then ``later`` (the same request, consecutive steps).

        Deltas (new ids, text, logprobs) concatenate; totals and the finish verdict are ``later``'s;
        prompt logprobs (sent with a request's first output only) are kept from whichever carries them.
        Used when a consumer fell behind: it gets one bigger delta instead of a backlog of small ones.
        """
        lps = None if self.logprobs is None and later.logprobs is None else (self.logprobs or []) + (later.logprobs or [])
        return dataclasses.replace(later, new_token_ids=self.new_token_ids + later.new_token_ids,
                                   text_delta=self.text_delta + later.text_delta, logprobs=lps,
                                   prompt_logprobs=self.prompt_logprobs if self.prompt_logprobs is not None
                                   else later.prompt_logprobs)
