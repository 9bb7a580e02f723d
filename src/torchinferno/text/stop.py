"""Stop strings on streamed text.

Generated text arrives in deltas, and a stop string may be split across them ("</an" + "swer>"),
so text that could be the beginning of a stop string is held back until the next delta decides.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["StopChecker"]


class StopChecker:
    """Filters a text stream, cutting it before the first occurrence of any stop string.

    Invariants: the concatenation of everything returned by ``feed``/``flush`` equals the full
    text cut just before the stop-string occurrence that is *completed* first (the earliest end;
    on a tie the earliest start) — or the full text if none occurs — however the text is split
    into deltas; the stop string itself and anything after it are never returned. At most
    ``max(len(s) for s in stop_strings) - 1`` characters are held back between calls, and each
    ``feed`` costs O(len(delta) + that) per stop string, whatever the total length.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        self.stop_strings = [s for s in dict.fromkeys(stop_strings) if s]
        self._max_hold = max((len(s) for s in self.stop_strings), default=1) - 1
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that was hit, if any

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add ``delta``; return ``(text safe to emit now, whether a stop string was hit)``.

        Once a stop string has been hit every later call returns ``("", True)``.
        """
        if self.stopped:
            return "", True
        if not self.stop_strings:
            return delta, False
        buf = self._held + delta
        cut, hit, end = -1, None, -1
        for s in self.stop_strings:
            i = buf.find(s)
            # The stop string completed first wins; on equal ends, the one starting earlier.
            if i != -1 and (hit is None or (i + len(s), i) < (end, cut)):
                cut, hit, end = i, s, i + len(s)
        if hit is not None:
            self.stopped, self.matched, self._held = True, hit, ""
            return buf[:cut], True
        keep = self._holdback(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def _holdback(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string."""
        for n in range(min(self._max_hold, len(buf)), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return n
        return 0

    def flush(self) -> str:
        """End of stream: return the held-back tail (it can no longer become a stop string)."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out
