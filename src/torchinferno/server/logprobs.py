"""Logprob entries of the OpenAI responses, built the same way for streams and whole responses.

A :class:`LogprobEntry` is recorded for every generated token as its ``RequestOutput`` arrives (so a
stream and a non-stream response list exactly the same entries: one per completion token), with
``text_offset`` = the number of characters of the choice's text returned before that token's output. A
token whose text delta is empty (the first bytes of a multi-byte character, a skipped special token) keeps
its entry; a stream sends it with the next chunk that has text, or with the final chunk.

``bytes`` are ``Tokenizer.token_bytes`` (the token's own bytes, never U+FFFD's). ``logprob`` values that
are not finite (a token masked by top-k/top-p has ``-inf``) are written as ``-9999.0``, as vLLM does, so the
JSON stays valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LogprobEntry", "LogprobFormatter", "entries_of_output", "prompt_entries", "shifted"]

NEG_INF_LOGPROB = -9999.0


@dataclass
class LogprobEntry:
    token_id: int
    logprob: float | None  # None: the first prompt token (nothing to condition on)
    top_token_ids: list[int]
    top_logprobs: list[float]
    text_offset: int  # characters of the returned text before this token


def _finite(v: float | None) -> float | None:
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return None
    return v if math.isfinite(v) else (NEG_INF_LOGPROB if v < 0 else 0.0)


def entries_of_output(new_token_ids: list[int], logprobs, text_before: int, text_delta: str, pieces) -> list[LogprobEntry]:
    """Entries for one output's new tokens. ``text_before``: characters returned before this output; tokens of
    one output are placed at successive piece lengths within ``text_delta`` (``pieces(id) -> str``)."""
    out, off = [], 0
    for tid, lp in zip(new_token_ids, logprobs or []):
        out.append(LogprobEntry(tid, lp.logprob, list(lp.top_token_ids), list(lp.top_logprobs),
                                text_before + min(off, len(text_delta))))
        off += len(pieces(tid))
    return out


class LogprobFormatter:
    """Entries -> the chat (``logprobs.content``) or completions (``tokens``/``token_logprobs``/...) shape."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def piece(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=False)

    def _token_bytes(self, token_id: int) -> list[int]:
        return list(self.tok.token_bytes(token_id))

    def chat(self, entries: list[LogprobEntry]) -> dict:
        content = []
        for e in entries:
            content.append({
                "token": self.piece(e.token_id), "logprob": _finite(e.logprob), "bytes": self._token_bytes(e.token_id),
                "top_logprobs": [{"token": self.piece(t), "logprob": _finite(v), "bytes": self._token_bytes(t)}
                                 for t, v in zip(e.top_token_ids, e.top_logprobs)],
            })
        return {"content": content}

    def completion(self, entries: list[LogprobEntry], shift: int = 0) -> dict:
        """``shift`` is added to every ``text_offset`` (the echoed prompt's length, for generated tokens)."""
        tokens, lps, tops, offsets = [], [], [], []
        for e in entries:
            tokens.append(self.piece(e.token_id))
            lps.append(_finite(e.logprob))
            tops.append(None if e.logprob is None and not e.top_token_ids else
                        {self.piece(a): _finite(b) for a, b in zip(e.top_token_ids, e.top_logprobs)})
            offsets.append(e.text_offset + shift)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def prompt_entries(prompt_ids: list[int], prompt_logprobs, tokenizer, text_len: int) -> list[LogprobEntry]:
    """Entries of an echoed prompt: the first token has no logprob (``None``), token ``i >= 1`` has
    ``prompt_logprobs[i - 1]``. ``text_offset`` counts the characters of the echoed text (special tokens
    contribute none, as ``decode`` skips them) before each token, capped at ``text_len``."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chars, out = 0, []
    lps = [None, *(prompt_logprobs or [])]
    for i, tid in enumerate(prompt_ids):
        lp = lps[i] if i < len(lps) else None
        out.append(LogprobEntry(tid, None if lp is None else lp.logprob, [] if lp is None else list(lp.top_token_ids),
                                [] if lp is None else list(lp.top_logprobs), min(chars, text_len)))
        if not tokenizer.is_special(tid):
            chars += len(dec.decode(tokenizer.token_bytes(tid)))
    return out


def shifted(entries: list[LogprobEntry], shift: int) -> list[LogprobEntry]:
    """``entries`` with ``shift`` added to every ``text_offset`` (generated tokens after an echoed prompt)."""
    return [LogprobEntry(e.token_id, e.logprob, e.top_token_ids, e.top_logprobs, e.text_offset + shift) for e in entries]
