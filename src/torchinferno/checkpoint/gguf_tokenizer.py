"""Build ``tokenizer.json`` + ``tokenizer_config.json`` from a GGUF file's tokenizer metadata.

Supported ``tokenizer.ggml.model`` values:

* ``gpt2`` -- byte-level BPE from ``tokens`` + ``merges``. The pre-tokenizer follows
  ``tokenizer.ggml.pre``: the GPT-2 regex by default; GPT-2 regex after isolating every digit for
  ``smollm``/``starcoder``/``refact`` (what llama.cpp does for them, and what the original HF
  tokenizers do; with the digit-free merges those vocabularies have it tokenizes exactly like
  transformers' GGUF converter); the Llama-3 / Qwen2 split regexes for those families.
* ``llama`` -- SentencePiece-style BPE with byte fallback (``scores`` give the merge order when
  the file has no ``merges``), ``\u2581`` word-boundary marker, optional prefix space.

Invariants: every token keeps the id the GGUF gives it (the embedding rows stay valid); tokens
typed CONTROL (and UNKNOWN for ``llama``) become special added tokens, USER_DEFINED ones plain
added tokens, so both match whole in text; BOS/EOS insertion is baked into the post-processor
from ``tokenizer.ggml.add_bos_token`` / ``add_eos_token``, so plain ``tokenizers`` encoding
already gives model-ready ids.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torchinferno.errors import CheckpointError

log = logging.getLogger(__name__)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_GPT2_PRE = {None, "", "default", "gpt-2", "gpt2"}
_DIGITS_THEN_GPT2_PRE = {"smollm", "starcoder", "refact"}
_SPLIT_PRE = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
SUPPORTED_MODELS = ("gpt2", "llama")


def write_tokenizer_files(meta: dict[str, Any], out_dir: Path, path: Path) -> bool:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``.

    Returns False (writing nothing) when the GGUF carries no vocabulary at all.
    """
    from torchinferno.checkpoint.safetensors_io import write_json

    kind = meta.get("tokenizer.ggml.model")
    if kind in (None, "none", "no_vocab") or not meta.get("tokenizer.ggml.tokens"):
        log.warning("GGUF file %s has no tokenizer; writing none", path)
        return False
    tok = build_tokenizer(meta, path)
    tok.save(str(out_dir / "tokenizer.json"))
    write_json(out_dir / "tokenizer_config.json", tokenizer_config(meta))
    return True


def build_tokenizer(meta: dict[str, Any], path: Path) -> Any:
    """A ``tokenizers.Tokenizer`` equivalent to the one the GGUF metadata describes."""
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tok = _byte_level_bpe(meta, path)
    elif kind == "llama":
        tok = _sentencepiece_bpe(meta, path)
    else:
        raise CheckpointError(
            f"unsupported GGUF tokenizer model {kind!r} in {path} (supported: {', '.join(SUPPORTED_MODELS)})"
        )
    _add_special_tokens(tok, meta, special_types=(CONTROL,) if kind == "gpt2" else (CONTROL, UNKNOWN))
    tok.post_processor = _post_processor(meta)
    return tok


def add_bos_default(meta: dict[str, Any]) -> bool:
    """``add_bos_token``: the file's flag, else True for SentencePiece vocabularies, False for BPE."""
    flag = meta.get("tokenizer.ggml.add_bos_token")
    return bool(flag) if flag is not None else meta.get("tokenizer.ggml.model") == "llama"


def tokenizer_config(meta: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json``: special token strings, BOS/EOS flags, chat template."""
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": add_bos_default(meta),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
    }
    arch = meta.get("general.architecture", "")
    if meta.get(f"{arch}.context_length"):
        cfg["model_max_length"] = int(meta[f"{arch}.context_length"])
    if meta.get("tokenizer.chat_template"):
        cfg["chat_template"] = meta["tokenizer.chat_template"]
    return cfg


# ------------------------------------------------------------------------------------ builders


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE vocabularies."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _byte_level_bpe(meta: dict[str, Any], path: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models

    tokens, types = _tokens_and_types(meta)
    b2u = byte_to_unicode()
    alphabet = set(b2u.values())
    vocab: dict[str, int] = {}
    for i, (t, kind) in enumerate(zip(tokens, types)):
        if kind not in (CONTROL, USER_DEFINED) and not set(t) <= alphabet:
            t = "".join(b2u[b] for b in t.encode("utf-8"))  # a token stored as raw text
        vocab.setdefault(t, i)
    raw_merges = meta.get("tokenizer.ggml.merges")
    if not raw_merges:
        raise CheckpointError(f"GGUF file {path} has a gpt2 tokenizer but no 'tokenizer.ggml.merges'")
    merges = [_split_merge(m, i, path) for i, m in enumerate(raw_merges)]
    tok = Tokenizer(_bpe(models, vocab, merges, path, byte_fallback=False, unk=None))
    tok.pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre"), path)
    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_level_pre_tokenizer(pre: str | None, path: Path) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if pre in _DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if pre in _SPLIT_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PRE[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if pre not in _GPT2_PRE:
        log.warning("GGUF file %s: unknown tokenizer.ggml.pre %r, using the GPT-2 byte-level split", path, pre)
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _sentencepiece_bpe(meta: dict[str, Any], path: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, types = _tokens_and_types(meta)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    if meta.get("tokenizer.ggml.merges"):
        merges = [_split_merge(m, i, path) for i, m in enumerate(meta["tokenizer.ggml.merges"])]
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if not scores or len(scores) != len(tokens):
            raise CheckpointError(f"GGUF file {path} has a llama tokenizer without merges or per-token scores")
        merges = merges_from_scores(tokens, scores, types, vocab)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None and 0 <= int(unk_id) < len(tokens) else None
    tok = Tokenizer(_bpe(models, vocab, merges, path, byte_fallback=True, unk=unk))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def merges_from_scores(tokens: list[str], scores: list[float], types: list[int], vocab: dict[str, int]) -> list:
    """BPE merges implied by a SentencePiece vocabulary: every split ``l + r`` of a normal token
    into two vocabulary pieces, best merged-token score first (ties: longer left piece, longer
    right piece, then lower ids)."""
    ranked = []
    for i, (t, kind) in enumerate(zip(tokens, types)):
        if kind not in (NORMAL, USER_DEFINED) or vocab.get(t) != i:
            continue
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], -len(left), -len(right), i, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(r[6], r[7]) for r in ranked]


def _tokens_and_types(meta: dict[str, Any]) -> tuple[list[str], list[int]]:
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        types = (types + [NORMAL] * len(tokens))[: len(tokens)]
    return tokens, types


def _split_merge(m: str, i: int, path: Path) -> tuple[str, str]:
    parts = m.split(" ")
    if len(parts) != 2 or not all(parts):
        raise CheckpointError(f"malformed merge #{i} {m!r} in 'tokenizer.ggml.merges' of {path}")
    return parts[0], parts[1]


def _bpe(models: Any, vocab: dict, merges: list, path: Path, byte_fallback: bool, unk: str | None) -> Any:
    try:
        return models.BPE(
            vocab=vocab, merges=merges, dropout=None, unk_token=unk, fuse_unk=byte_fallback,
            byte_fallback=byte_fallback, continuing_subword_prefix="", end_of_word_suffix="",
        )
    except Exception as e:  # tokenizers rejects merges whose pieces are not in the vocabulary
        raise CheckpointError(f"invalid tokenizer vocabulary/merges in {path}: {e}") from None


def _add_special_tokens(tok: Any, meta: dict[str, Any], special_types: tuple[int, ...]) -> None:
    from tokenizers import AddedToken

    tokens, types = _tokens_and_types(meta)
    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k in special_types]
    plain = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if plain:
        tok.add_tokens(plain)


def _post_processor(meta: dict[str, Any]) -> Any:
    from tokenizers import processors

    tokens = meta["tokenizer.ggml.tokens"]
    single, pair, specials = "$A:0", "$B:1", []
    for flag, key, first in (
        (add_bos_default(meta), "bos_token_id", True),
        (bool(meta.get("tokenizer.ggml.add_eos_token", False)), "eos_token_id", False),
    ):
        i = meta.get(f"tokenizer.ggml.{key}")
        if not flag or i is None:
            continue
        t = tokens[int(i)]
        specials.append((t, int(i)))
        single = f"{t}:0 {single}" if first else f"{single} {t}:0"
        pair = f"{t}:1 {pair}" if first else f"{pair} {t}:1"
    return processors.TemplateProcessing(single=single, pair=f"{single} {pair}", special_tokens=specials)
