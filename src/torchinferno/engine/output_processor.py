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
        return RequestOutput(
            request_id=self.request_id,
            new_token_ids=list(new_token_ids),
            text_delta=delta,
            text=self.text,
            token_ids=list(self.token_ids),
            finished=self.finish_reason is not None,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_token_ids),
            completion_tokens=len(self.token_ids),
            stop_reason=self.stop_reason,
            logprobs=logprobs,
            num_cached_tokens=num_cached_tokens,
            prompt_token_ids=self.prompt_token_ids,
        )
