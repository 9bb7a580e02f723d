"""A file-free tokenizer over raw UTF-8 bytes, for tests and tiny random-weight models."""

from __future__ import annotations

import re
from typing import Iterable

from torchinferno.text.base import Tokenizer

__all__ = ["ByteTokenizer", "BYTE_CHAT_TEMPLATE"]

# Roles become plain-text headers; each turn ends with the eos special token, so a model trained
# (or scripted) on this format stops by emitting <eos>.
BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ByteTokenizer(Tokenizer):
    """Ids ``0..255`` are the bytes of the UTF-8 text; ``256=<bos>``, ``257=<eos>``, ``258=<pad>``.

    Invariants: ``vocab_size == 259``; ``encode(text, add_special_tokens=False)`` is exactly the
    UTF-8 bytes of ``text`` except that the literal strings ``<bos>``/``<eos>``/``<pad>`` map to
    their special ids; ``add_special_tokens=True`` prepends ``<bos>``;
    ``decode(encode(t, False), skip_special_tokens=False) == t`` for every string ``t``;
    invalid UTF-8 decodes with U+FFFD replacement (one per maximal invalid subpart).
    """

    BOS, EOS, PAD = 256, 257, 258
    SPECIALS = {"<bos>": BOS, "<eos>": EOS, "<pad>": PAD}

    def __init__(self) -> None:
        self._special_to_text = {i: s for s, i in self.SPECIALS.items()}
        self._split_re = re.compile("(" + "|".join(re.escape(s) for s in self.SPECIALS) + ")")

    @property
    def name(self) -> str:
        return "byte"

    @property
    def vocab_size(self) -> int:
        return 259

    @property
    def eos_token_ids(self) -> list[int]:
        return [self.EOS]

    @property
    def bos_token_id(self) -> int | None:
        return self.BOS

    @property
    def pad_token_id(self) -> int:
        return self.PAD

    @property
    def chat_template(self) -> str:
        return BYTE_CHAT_TEMPLATE

    def template_variables(self) -> dict[str, str]:
        return {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = [self.BOS] if add_special_tokens else []
        for part in self._split_re.split(text):
            special = self.SPECIALS.get(part)
            if special is not None:
                ids.append(special)
            elif part:
                ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in self._check_ids(ids):
            if i < 256:
                buf.append(i)
                continue
            # A special token ends the byte run; decode the run on its own, as the HF byte-level
            # decoder does around added tokens.
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
            if not skip_special_tokens:
                out.append(self._special_to_text[i])
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def id_to_piece(self, token_id: int) -> str:
        (i,) = self._check_ids([token_id])
        return self._special_to_text[i] if i >= 256 else f"<0x{i:02X}>"

    def is_special(self, token_id: int) -> bool:
        return int(token_id) >= 256

    def token_bytes(self, token_id: int) -> bytes:
        (i,) = self._check_ids([token_id])
        return bytes([i]) if i < 256 else self._special_to_text[i].encode("utf-8")
