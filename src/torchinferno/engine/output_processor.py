"""Tokens -> text: per-request text state, stop strings, and ``RequestOutput``s.

Stop handling is ``text.sequence_text.SequenceText`` (shared with ``engine/generate.py``). The
engine core applies the token-level rules (stop token, ``max_tokens``) because its scheduler owns
request state; its ``EngineCoreOutput`` carries that verdict in, and this module gets the text and
final reason back. A stop string found here is reported to the caller, which finishes the request
in the core (``EngineCore.finish_requests(ids, "stop")``). The ``OutputProcessor`` runs wherever the
tokenizer lives: in the API-server process for ``serve``, in-process for ``LLM``.
"""

from __future__ import annotations

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.core_types import EngineCoreOutput
from torchinferno.engine.outputs import RequestOutput, TokenLogprob
from torchinferno.text.sequence_text import SequenceText

__all__ = ["RequestTextState", "OutputProcessor"]


class RequestTextState:
    """Accumulates one request's generated ids and text."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params, tokenizer=None):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.token_ids: list[int] = []
        self.seq = SequenceText(tokenizer, params.stop)

    @property
    def text(self) -> str:
        return self.seq.text

    @property
    def finish_reason(self) -> str | None:
        return self.seq.finish_reason

    @property
    def stop_reason(self) -> int | str | None:
        return self.seq.stop_reason

    def add_token(self, tok: int, is_stop_token: bool, is_length: bool) -> str:
        """Apply one sampled token with the core's token-level verdict on it.

        Returns the text delta; sets ``finish_reason`` / ``stop_reason`` when the request ends.
        """
        self.token_ids.append(tok)
        return self.seq.add(tok, is_stop_token, is_length)

    def abort(self) -> None:
        if self.seq.finish_reason is None:
            self.seq.finish_reason = "abort"

    def make_output(self, new_token_ids: list[int], delta: str, num_cached_tokens: int = 0,
                    logprobs: list[TokenLogprob] | None = None,
                    prompt_logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
        seq = self.seq
        # Positional (field order of RequestOutput): this runs once per request per step.
        return RequestOutput(
            self.request_id,
            list(new_token_ids),
            delta,  # text_delta
            seq.text,
            list(self.token_ids),  # cumulative: a snapshot, the state's list keeps growing
            seq.finish_reason is not None,  # finished
            seq.finish_reason,
            len(self.prompt_token_ids),  # prompt_tokens
            len(self.token_ids),  # completion_tokens
            seq.stop_reason,
            logprobs,
            num_cached_tokens,
            self.prompt_token_ids,
            prompt_logprobs,
        )


class OutputProcessor:
    """Turns ``EngineCoreOutput``s into ``RequestOutput``s for the requests it was told about.

    Invariants: a request is known from ``add_request`` until its final output (or ``abort``); outputs for
    unknown ids (finished here already, e.g. by a stop string, while the core still ran a step) are dropped.
    """

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self.states: dict[str, RequestTextState] = {}

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.states[request_id] = RequestTextState(request_id, prompt_token_ids, params, self.tokenizer)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.states

    def __len__(self) -> int:
        return len(self.states)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Forget a live request; its final output (``finish_reason="abort"``), or None if unknown."""
        state = self.states.pop(request_id, None)
        if state is None:
            return None
        state.abort()
        return state.make_output([], "")

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """-> (request outputs, ids of requests a stop string ended: the caller finishes them in the core)."""
        results: list[RequestOutput] = []
        stopped: list[str] = []
        states = self.states
        for o in outputs:
            state = states.get(o.request_id)
            if state is None:
                continue
            toks = o.new_token_ids
            last = len(toks) - 1
            delta = ""
            for i, tok in enumerate(toks):
                end = o.finish_reason if i == last else None
                delta += state.add_token(tok, end == "stop" and o.stop_reason == tok, end == "length")
            if o.finish_reason == "abort":
                state.abort()
            reason = state.finish_reason
            if reason is not None and o.finish_reason is None:
                stopped.append(o.request_id)
            results.append(state.make_output(toks, delta, o.num_cached_tokens, o.logprobs, o.prompt_logprobs))
            if reason is not None:
                del states[o.request_id]
        return results, stopped
