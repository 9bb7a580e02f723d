"""Streaming detokenization: token ids in, newly completed text out.

Technique (prefix/read offsets): the text of a new token depends on a little context before it
(a leading-space rule, a multi-byte character split over tokens), so each step decodes only the
window ``ids[prefix:]`` and compares it with the text of ``ids[prefix:read]`` (the context,
already emitted). The window moves forward whenever the decoded text ends cleanly, so its
length — and the cost of a step — stays bounded by a few tokens, whatever the total length.

UTF-8 safety: while the window's text ends with U+FFFD, that last character may still be an
incomplete multi-byte sequence that the next token completes, so the trailing U+FFFD run is held
back; everything before it is final and is emitted at once. ``flush`` releases what is held.
SentencePiece byte-fallback pieces (``tokenizer.unstable_token_ids``) are decoded as a group
that turns entirely into U+FFFD when invalid, so a group is held until a non-byte token ends it.
"""

from __future__ import annotations

from torchinferno.text.base import Tokenizer

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"
# When more than this many tokens pile up after the read offset with the text still ending in
# U+FFFD (a run of invalid bytes), the window is re-anchored at the last clean boundary.
_MAX_PENDING_TOKENS = 8
# A byte-fallback group is held back whole up to this many tokens (then streamed as decoded).
_MAX_PENDING_GROUP = 32


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas.

    Invariant (tested): ``"".join(add(t) for t in ids) + flush() == tokenizer.decode(ids,
    skip_special_tokens)`` for tokenizers whose decode of a sequence that ends on a character
    boundary does not change when more tokens are appended (byte-level BPE, SentencePiece,
    byte tokenizers), except after a byte-fallback group longer than 32 tokens that later turns
    out invalid. (A config's ``clean_up_tokenization_spaces`` on a non-BPE tokenizer can break
    the equality at window edges.) No delta contains a U+FFFD that a later token would turn into a character.
    Per-step cost is O(window), the window being the tokens since the last clean boundary.

    Attributes ``prefix_offset``/``read_offset`` index ``token_ids``; ``emitted`` is the
    position in the window text ``decode(token_ids[prefix_offset:])`` up to which text has been
    returned (always ``>=`` the length of the context ``decode(token_ids[prefix_offset:read_offset])``).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.emitted = 0  # chars of the current window text already returned
        self._context_len: int | None = 0  # len(decode(ids[prefix:read])), None = not computed yet
        self._finished = False
        # Byte-fallback pieces: their group's text is only final once a non-byte token follows.
        self._unstable: frozenset[int] = getattr(tokenizer, "unstable_token_ids", frozenset())
        self._in_group = False

    def _skipped(self, token_id: int) -> bool:
        """Whether ``decode`` drops this id (a special token with ``skip_special_tokens``)."""
        return self.skip_special_tokens and self.tokenizer.is_special(token_id)

    def _decode(self, start: int, stop: int | None = None) -> str:
        return self.tokenizer.decode(self.token_ids[start:stop], skip_special_tokens=self.skip_special_tokens)

    def _context(self) -> int:
        if self._context_len is None:
            self._context_len = len(self._decode(self.prefix_offset, self.read_offset))
        return self._context_len

    def add(self, token_id: int) -> str:
        """Append one token and return the text that became final (possibly ``""``)."""
        if self._finished:
            raise RuntimeError("IncrementalDetokenizer.add called after flush")
        token_id = int(token_id)
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if vocab is not None and not 0 <= token_id < vocab:
            # Models often pad the embedding past the tokenizer's vocab; such ids carry no text.
            return ""
        self.token_ids.append(token_id)
        if self._unstable:
            # Inside a byte-fallback group its text may still turn into U+FFFD; a special token
            # that decode skips does not end the group (the decoder never sees it).
            if token_id in self._unstable or (self._in_group and self._skipped(token_id)):
                self._in_group = True
                if len(self.token_ids) - self.read_offset <= _MAX_PENDING_GROUP:
                    return ""
            else:
                self._in_group = False
        context = self._context()
        text = self._decode(self.prefix_offset)
        clean = not text.endswith(_REPLACEMENT)
        safe_end = len(text) if clean else len(text.rstrip(_REPLACEMENT))
        anchor = None
        if not clean and len(self.token_ids) - self.read_offset > _MAX_PENDING_TOKENS:
            anchor = self._find_anchor(text, context)
            if anchor is not None:
                safe_end = max(safe_end, anchor[1])
        start = max(self.emitted, context)
        delta = text[start:safe_end] if safe_end > start else ""
        self.emitted = max(start, safe_end)
        if clean and len(text) > context:
            # The new tokens produced text and it ends on a character boundary: they become the
            # context of the next window. (Tokens that produced no text, e.g. skipped specials,
            # stay in the window so a first-token rule never sees them as a sequence start.)
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            self._context_len = None
            self.emitted = 0
        elif anchor is not None:
            # Re-anchor at token `j` whose text is final; what was emitted past it keeps its
            # place in the new window's coordinates.
            j, head_len = anchor
            beyond = self.emitted - head_len
            self.prefix_offset, self.read_offset = self.read_offset, j
            self._context_len = None
            self.emitted = self._context() + beyond
        return delta

    def _find_anchor(self, text: str, context: int) -> tuple[int, int] | None:
        """A token index ``j`` (and ``len(decode(ids[prefix:j]))``) whose text is final.

        Used when the window keeps ending in U+FFFD (invalid bytes). With lossy UTF-8 decoding
        only the last character can still change (one pending incomplete sequence), so a prefix
        of the window text followed by at least two more characters is final.
        """
        last = len(self.token_ids)
        for j in range(last - 1, max(self.read_offset, last - 1 - _MAX_PENDING_TOKENS), -1):
            if self.token_ids[j - 1] in self._unstable:
                continue
            head = self._decode(self.prefix_offset, j)
            if len(head) > context and len(text) - len(head) >= 2 and text.startswith(head):
                return j, len(head)
        return None

    def flush(self) -> str:
        """Return everything still held back (e.g. a trailing U+FFFD that is now final)."""
        if self._finished:
            return ""
        self._finished = True
        if len(self.token_ids) == self.prefix_offset:
            return ""
        text = self._decode(self.prefix_offset)
        start = max(self.emitted, self._context())
        return text[start:]
