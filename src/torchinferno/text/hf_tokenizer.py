"""``HFTokenizer``: a Hugging Face ``tokenizer.json`` directory, read without transformers.

Matches ``transformers.AutoTokenizer`` (v5, tokenizers backend) on the same directory for
``encode`` (with/without special tokens), ``decode`` (both ``skip_special_tokens`` settings) and
``apply_chat_template(..., tokenize=False)``. What is reproduced:

* ``tokenizer.json`` is the pipeline (normalizer, pre-tokenizer, model, post-processor, decoder);
  its truncation/padding are switched off, as transformers does for a plain ``encode``.
  As in transformers 5, ``add_bos_token``/``add_eos_token`` in the config are ignored when a
  ``tokenizer.json`` exists: the post-processor decides what ``add_special_tokens`` adds.
* ``tokenizer_config.json``'s ``added_tokens_decoder`` entries are (re-)added, and named special
  tokens (``bos_token``, ``eos_token``, ..., any ``*_token`` string, ``extra_special_tokens``)
  that are not yet added tokens are added as special tokens.
* ``clean_up_tokenization_spaces`` is applied on decode only for non-BPE models (transformers
  refuses it for BPE unless ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output``).
* The chat template comes from ``chat_template.jinja`` if present, else the config's
  ``chat_template`` (a string, or a list of ``{name, template}`` where ``default`` is used).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Iterable

from torchinferno.errors import TokenizerError
from torchinferno.text.base import Tokenizer

__all__ = ["HFTokenizer", "END_OF_TURN_MARKERS"]

# End-of-turn tokens of common chat formats; one counts as an eos id when the chat template
# writes it and the vocabulary has it.
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endofturn|>")

_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise TokenizerError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    """A special-token config value (string or serialized AddedToken dict) -> its text."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class HFTokenizer(Tokenizer):
    """Wraps ``tokenizers.Tokenizer`` loaded from ``<directory>/tokenizer.json``.

    Invariants: the backend is configured once in ``__init__`` and never mutated after;
    ``eos_token_ids`` lists the config's ``eos_token`` first, then ids from
    ``generation_config.json``/``config.json`` ``eos_token_id``, then end-of-turn markers the
    chat template uses (see ``END_OF_TURN_MARKERS``), without duplicates.
    """

    def __init__(self, directory: str | Path) -> None:
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as RustTokenizer

        self._dir = Path(directory)
        tok_file = self._dir / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerError(f"no tokenizer.json in {self._dir}")
        try:
            backend = RustTokenizer.from_file(str(tok_file))
        except Exception as e:  # the Rust error type is not importable
            raise TokenizerError(f"cannot load {tok_file}: {str(e).splitlines()[0] if str(e) else e}") from None
        backend.no_truncation()
        backend.no_padding()

        cfg = _read_json(self._dir / "tokenizer_config.json")
        self._config = cfg

        # 1) added tokens recorded in the config, in id order (transformers re-adds all of them).
        config_added = []
        for idx, spec in sorted((cfg.get("added_tokens_decoder") or {}).items(), key=lambda kv: int(kv[0])):
            if isinstance(spec, dict) and isinstance(spec.get("content"), str):
                fields = {k: spec[k] for k in ("single_word", "lstrip", "rstrip", "normalized", "special")
                          if k in spec}
                config_added.append(AddedToken(spec["content"], **fields))
        # 2) named special tokens: the standard ones, any other `*_token` string, extra_special_tokens.
        self._special_map: dict[str, str] = {}
        named_values: list[Any] = []
        for key, value in cfg.items():
            if key in _NAMED_SPECIAL or (key.endswith("_token") and _token_content(value) is not None):
                content = _token_content(value)
                if content is not None:
                    self._special_map[key] = content
                    named_values.append(value)
        extra = cfg.get("extra_special_tokens") or cfg.get("additional_special_tokens")
        if isinstance(extra, dict):
            for key, value in extra.items():
                if _token_content(value) is not None:
                    self._special_map[key] = _token_content(value)
                    named_values.append(value)
        elif isinstance(extra, list):
            named_values.extend(v for v in extra if _token_content(v) is not None)

        existing = {t.content for t in backend.get_added_tokens_decoder().values()}
        to_add = list(config_added)
        queued = existing | {t.content for t in config_added}
        for value in named_values:
            content = _token_content(value)
            if content in queued:
                continue
            queued.add(content)
            if isinstance(value, dict):
                fields = {k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized") if k in value}
                to_add.append(AddedToken(content, special=True, **fields))
            else:
                to_add.append(AddedToken(content, special=True))
        if to_add:
            backend.add_tokens(to_add)
        backend.encode_special_tokens = bool(cfg.get("split_special_tokens", False))
        self._backend = backend

        force_bpe_cleanup = bool(cfg.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
        self._cleanup = bool(cfg.get("clean_up_tokenization_spaces", False)) and (
            type(backend.model).__name__ != "BPE" or force_bpe_cleanup)
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        max_added = max(added) + 1 if added else 0
        self._vocab_size = max(backend.get_vocab_size(with_added_tokens=True), max_added)
        self._unstable_ids = self._byte_fallback_ids()
        self._byte_level = '"ByteLevel"' in self._decoder_spec()
        self._chat_template = self._load_chat_template(cfg)
        self._bos_id = self._piece_id(self._special_map.get("bos_token"))
        self._eos_ids = self._collect_eos_ids()

    # ----- loading helpers -------------------------------------------------------------------
    def _load_chat_template(self, cfg: dict[str, Any]) -> str | None:
        jinja_file = self._dir / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8")
        template = cfg.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is None:
            legacy = _read_json(self._dir / "chat_template.json").get("chat_template")
            template = legacy if isinstance(legacy, str) else None
        if template is not None and not isinstance(template, str):
            raise TokenizerError(f"chat_template in {self._dir / 'tokenizer_config.json'} must be a string")
        return template

    def _decoder_spec(self) -> str:
        """The decoder's JSON (``""`` when there is none or it cannot be serialized)."""
        decoder = self._backend.decoder
        if decoder is None:
            return ""
        try:
            spec = decoder.__getstate__()
            return spec.decode("utf-8") if isinstance(spec, bytes) else str(spec)
        except Exception:  # unknown decoder object: assume the common case
            return ""

    def _byte_fallback_ids(self) -> frozenset[int]:
        """Ids of ``<0xNN>`` pieces when the decoder groups them (a ``ByteFallback`` step)."""
        if '"ByteFallback"' not in self._decoder_spec():
            return frozenset()
        ids = (self._backend.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in ids if i is not None)

    def _piece_id(self, piece: str | None) -> int | None:
        return None if piece is None else self._backend.token_to_id(piece)

    def _collect_eos_ids(self) -> list[int]:
        ids: list[int] = []
        primary = self._piece_id(self._special_map.get("eos_token"))
        if primary is not None:
            ids.append(primary)
        for fname in ("generation_config.json", "config.json"):
            ids.extend(_as_id_list(_read_json(self._dir / fname).get("eos_token_id")))
        template = self._chat_template or ""
        for marker in END_OF_TURN_MARKERS:
            if marker in template:
                marker_id = self._piece_id(marker)
                if marker_id is not None:
                    ids.append(marker_id)
        return [i for n, i in enumerate(ids) if i not in ids[:n] and 0 <= i < self._vocab_size]

    # ----- Tokenizer interface ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self._dir)

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos_ids)

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_id

    @property
    def pad_token_id(self) -> int | None:
        return self._piece_id(self._special_map.get("pad_token"))

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer`` (read-only use, please)."""
        return self._backend

    @property
    def unstable_token_ids(self) -> frozenset[int]:
        return self._unstable_ids

    def template_variables(self) -> dict[str, str]:
        return dict(self._special_map)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        text = self._backend.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)
        if self._cleanup:
            text = _clean_up_tokenization(text)
        return text

    def id_to_piece(self, token_id: int) -> str:
        (i,) = self._check_ids([token_id])
        piece = self._backend.id_to_token(i)
        return "" if piece is None else piece

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """Byte-level BPE: the piece's characters mapped back through GPT-2's byte alphabet; byte-fallback
        ``<0xNN>`` pieces: that byte; added tokens and anything else: the decoded text's UTF-8."""
        (i,) = self._check_ids([token_id])
        if i in self._unstable_ids:
            return bytes([int(self.id_to_piece(i)[3:5], 16)])
        added = self._backend.get_added_tokens_decoder().get(i)
        if added is not None:
            return added.content.encode("utf-8")
        if self._byte_level:
            piece, table = self.id_to_piece(i), _unicode_to_byte()
            if piece and all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return super().token_bytes(i)


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable bytes stand for themselves, the other 68 bytes
    were shifted to U+0100.. in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {chr(b): b for b in keep}, 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _clean_up_tokenization(text: str) -> str:
    """The WordPiece-era space cleanup transformers applies when a config asks for it."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text
