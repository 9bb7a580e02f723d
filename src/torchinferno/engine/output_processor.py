"""Per-request text state and ``RequestOutput``s.

Stop handling is ``text.sequence_text.SequenceText`` (shared with ``engine/generate.py``). The
scheduler applies the token-level rules (stop token, ``max_tokens``) because it owns request
state; this module passes its verdict in and gets the text and final reason back.
"""

from __future__ import annotations

from torchinferno.engine.outputs import RequestOutput, TokenLogprob
from torchinferno.engine.request import Request, RequestStatus
from torchinferno.text.sequence_text import SequenceText

__all__ = ["RequestTextState"]


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

    def add_token(self, tok: int, request: Request) -> str:
        """Apply one sampled token; ``request`` carries the scheduler's token-level verdict.

        Returns the text delta; sets ``finish_reason`` / ``stop_reason`` when the request ends.
        """
        self.token_ids.append(tok)
        is_stop = request.status == RequestStatus.FINISHED_STOPPED and request.stop_reason == tok
        return self.seq.add(tok, is_stop, request.status == RequestStatus.FINISHED_LENGTH)

    def abort(self) -> None:
        if self.seq.finish_reason is None:
            self.seq.finish_reason = "abort"

    def make_output(self, new_token_ids: list[int], delta: str, num_cached_tokens: int = 0,
                    logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
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
        )
