"""The ``Tokenizer`` interface shared by every tokenizer implementation.

Import it from :mod:`torchinferno.text.tokenizer` (or :mod:`torchinferno.text`); this module only
exists so the concrete tokenizers can live in their own small files.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable, Mapping, Sequence

from torchinferno.errors import TokenizerError
from torchinferno.text.chat_template import render_chat_template

__all__ = ["Tokenizer"]


class Tokenizer(ABC):
    """Text <-> token ids, plus the model's chat template.

    Invariants every implementation keeps:

    * ids are ``0 <= id < vocab_size``; ``vocab_size`` counts every id the tokenizer can produce
      or decode, special/added tokens included (``len(hf_tokenizer)``, not HF's ``vocab_size``).
    * ``eos_token_ids`` is non-empty when the tokenizer knows any end token, has no duplicates,
      and lists the primary eos first.
    * ``decode`` never raises for ids in range; undecodable bytes become U+FFFD.
    * ``encode_chat(m) == encode(apply_chat_template(m), add_special_tokens=False)``: the template
      already writes the special tokens it needs (as transformers assumes).
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """A short human-readable name (``"byte"`` or the tokenizer directory)."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""

    @property
    @abstractmethod
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation (eos, end-of-turn markers, generation_config's eos)."""

    @property
    @abstractmethod
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence id, or ``None`` if the tokenizer has none."""

    @property
    def chat_template(self) -> str | None:
        """The jinja2 chat template source, or ``None``."""
        return None

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds what the tokenizer's post-processor
        adds (e.g. a BOS); special-token strings inside ``text`` map to their ids."""

    @abstractmethod
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; with ``skip_special_tokens`` special tokens contribute nothing."""

    @abstractmethod
    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry of one id (e.g. ``'Ġhello'``), for debugging and logprob display."""

    @abstractmethod
    def is_special(self, token_id: int) -> bool:
        """Whether ``decode(..., skip_special_tokens=True)`` drops this id."""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes this one token contributes to the text (the logprobs ``bytes`` field).

        Unlike ``decode([id]).encode()``, a token holding part of a UTF-8 character gives its own bytes,
        not U+FFFD's; the concatenated ``token_bytes`` of a sequence's tokens decode to its text. This
        default is only right for tokens that decode to whole characters; byte-level tokenizers override it.
        """
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    @property
    def unstable_token_ids(self) -> frozenset[int]:
        """Ids whose decoded text can change with the tokens that follow them.

        SentencePiece byte-fallback pieces (``<0xE4>``) are decoded as a group, and the whole
        group becomes U+FFFD if it is not valid UTF-8, so a streaming decoder must wait for the
        group to end. Empty for tokenizers without such tokens.
        """
        return frozenset()

    def template_variables(self) -> dict[str, Any]:
        """Extra variables passed to the chat template (the special tokens by name)."""
        return {}

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render ``messages`` (list of ``{"role", "content", ...}``) to the prompt string.

        ``extra`` reaches the template as variables (``tools=...``, ``enable_thinking=...``).
        Raises ``TokenizerError`` when there is no template or the template rejects the messages.
        """
        template = self.chat_template
        if template is None:
            raise TokenizerError(f"tokenizer {self.name!r} has no chat template; send a plain prompt instead")
        variables = {**self.template_variables(), **extra}
        return render_chat_template(template, messages, add_generation_prompt=add_generation_prompt, **variables)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    **extra: Any) -> list[int]:
        """Token ids of the rendered chat (template output encoded without extra special tokens)."""
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra)
        return self.encode(text, add_special_tokens=False)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        """Return ``ids`` as a list of ints, raising ``TokenizerError`` for out-of-range values."""
        out = [int(i) for i in ids]
        n = self.vocab_size
        if out and (min(out) < 0 or max(out) >= n):
            bad = next(i for i in out if i < 0 or i >= n)
            raise TokenizerError(f"token id {bad} is out of range for {self.name!r} (vocab_size {n})")
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"
