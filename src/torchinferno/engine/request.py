"""A request as the scheduler tracks it. Only the scheduler mutates these fields."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from torchinferno.core.sampling_params import SamplingParams

__all__ = ["Request", "RequestStatus"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # blocks freed; waits at the front of the queue to recompute
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason (``"stop"|"length"|"abort"``) of a finished status."""
        return self.value if self.is_finished else None


@dataclass(eq=False)
class Request:
    """One generation request.

    Invariants: ``num_computed_tokens <= num_tokens + num_inflight`` is the number of leading
    tokens whose KV sits in ``block_ids`` or is written there by a step already scheduled (it
    advances when a step is scheduled; ``len(block_ids) * block_size >= num_computed_tokens``);
    ``block_hashes[i]`` is the chained hash of full block ``i`` of ``all_token_ids``; the first
    ``num_registered_blocks`` blocks have been offered to the prefix cache (only blocks whose
    tokens the host knows). A preempted request has no blocks and ``num_computed_tokens == 0``;
    it resumes by recomputing prompt + generated tokens, so nothing it produced is lost.

    ``num_inflight`` counts tokens sampled by scheduled steps whose results have not been applied
    (the request's logical length is ``num_tokens + num_inflight``). Synchronous engine: 0 at
    every ``schedule()``. Async scheduling (one step in flight): at most 1 between engine steps and
    2 inside one (after scheduling step k, before step k-1's result is applied); a WAITING or
    PREEMPTED request has 0 whenever the scheduler considers admitting it.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    stop_token_ids: frozenset[int] = frozenset()  # eos (unless ignore_eos) | params.stop_token_ids
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_inflight: int = 0  # sampled by a scheduled step, not yet appended (async scheduling)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first admission
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    arrival_index: int = 0  # FCFS order assigned by the scheduler (ties of arrival_time)
    num_prompt_logprobs: int = 0  # prompt positions whose logprobs were scheduled (kept across preemption)
    # Prefill/decode disaggregation (disagg/): the prefill role keeps a finished request's blocks (``hold_kv``)
    # until its KV is sent; the decode role continues a request whose seeded generator already drew
    # ``num_prior_draws`` times on the prefill role.
    hold_kv: bool = False
    num_prior_draws: int = 0
    # Hybrid KV specs (scheduler's sliding pool): the sliding group's blocks, parallel to ``block_ids``; the first
    # ``num_slid_blocks`` lie wholly before the window and were given back (-1 there)
    sliding_block_ids: list[int] = field(default_factory=list)
    num_slid_blocks: int = 0

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def token_slice(self, start: int, stop: int) -> list[int]:
        """``all_token_ids[start:stop]`` without concatenating the whole sequence."""
        n = len(self.prompt_token_ids)
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        if start >= n:
            return self.output_token_ids[start - n : stop - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - n]
