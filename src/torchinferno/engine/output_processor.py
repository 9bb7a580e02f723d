"""Per-request text state: incremental detokenization, stop strings and ``RequestOutput``s.

Stop handling is the same as ``engine/generate.py``'s reference loop, token by token:

1. a stop token (eos unless ``ignore_eos``, or ``stop_token_ids``) finishes with ``"stop"``;
   its id is kept in ``token_ids`` but contributes no text;
2. otherwise the token's text goes through the UTF-8-safe incremental detokenizer and the stop
   string filter; completing a stop string finishes with ``"stop"`` and cuts the text before it;
3. reaching ``max_tokens`` (when not already stopped) finishes with ``"length"``;
4. on finish (except by stop string) held-back text is flushed.

The scheduler applies 1 and 3 (it owns request state); this module re-derives the same reason
and adds 2, which can turn a ``"length"`` finish into ``"stop"`` exactly as the reference does.
"""

from __future__ import annotations

from torchinferno.engine.outputs import RequestOutput, TokenLogprob
from torchinferno.engine.request import Request, RequestStatus

__all__ = ["RequestTextState"]


class RequestTextState:
    """Accumulates one request's generated ids and text."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params, tokenizer=None):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.detok = self.stopper = None
        if tokenizer is not None:
            from torchinferno.text.detokenizer import IncrementalDetokenizer
            from torchinferno.text.stop import StopChecker

            self.detok = IncrementalDetokenizer(tokenizer)
            self.stopper = StopChecker(params.stop) if params.stop else None

    def add_token(self, tok: int, request: Request) -> str:
        """Apply one sampled token; ``request`` carries the scheduler's token-level verdict.

        Returns the text delta; sets ``finish_reason`` / ``stop_reason`` when the request ends.
        """
        start = len(self.text)
        self.token_ids.append(tok)
        if request.status == RequestStatus.FINISHED_STOPPED and request.stop_reason == tok:
            self.finish_reason, self.stop_reason = "stop", tok
        elif self.detok is not None:
            self._emit(self.detok.add(tok))
        if self.finish_reason is None and request.status == RequestStatus.FINISHED_LENGTH:
            self.finish_reason = "length"
        if self.finish_reason is not None and self.detok is not None and self.stop_reason != "stop_string":
            self._emit(self.detok.flush())
            if self.stopper is not None and self.stop_reason != "stop_string":
                self.text += self.stopper.flush()
        return self.text[start:]

    def _emit(self, delta: str) -> None:
        if self.stopper is None:
            self.text += delta
            return
        safe, hit = self.stopper.feed(delta)
        self.text += safe
        if hit:
            self.finish_reason, self.stop_reason = "stop", "stop_string"

    def abort(self) -> None:
        if self.finish_reason is None:
            self.finish_reason = "abort"

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
