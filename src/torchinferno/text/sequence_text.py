"""The text side of one generated sequence, shared by plain generation and the serving engine.

Per sampled token, in order:

1. a stop token (decided by the caller: eos unless ``ignore_eos``, or ``stop_token_ids``)
   finishes with ``"stop"``; its id contributes no text;
2. otherwise the token's text goes through the UTF-8-safe incremental detokenizer and the stop
   string filter; completing a stop string finishes with ``"stop"`` and cuts the text before it;
3. reaching ``max_tokens`` (when not already stopped) finishes with ``"length"``;
4. on finish (except by stop string) held-back text is flushed — which may itself complete a
   stop string and turn a ``"length"`` finish into ``"stop"``.

Without a tokenizer there is no text and no stop strings; rules 1 and 3 still apply.
"""

from __future__ import annotations

__all__ = ["SequenceText"]


class SequenceText:
    def __init__(self, tokenizer=None, stop: list[str] | None = None):
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token id, "stop_string", or None
        self.detok = self.stopper = None
        if tokenizer is not None:
            from torchinferno.text.detokenizer import IncrementalDetokenizer
            from torchinferno.text.stop import StopChecker

            self.detok = IncrementalDetokenizer(tokenizer)
            self.stopper = StopChecker(stop) if stop else None

    def add(self, tok: int, is_stop_token: bool, at_max_tokens: bool) -> str:
        """Apply one token; returns the newly final text (possibly ``""``)."""
        start = len(self.text)
        if is_stop_token:
            self.finish_reason, self.stop_reason = "stop", tok
        elif self.detok is not None:
            self._emit(self.detok.add(tok))
        if self.finish_reason is None and at_max_tokens:
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
