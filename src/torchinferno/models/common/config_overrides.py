"""Field overrides for a family's tiny config: ``tiny_dsv4_config(vocab_size=128, max_seq_len=32)``.

Shared by every family's tiny/debug config function so they read and fail the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchinferno.errors import ConfigError

# README spellings accepted for a config field.
ALIASES = {"max_seq_len": "max_position_embeddings"}
# Special-token ids, in the order they take the top of a shrunk vocabulary (eos -> V-1, bos -> V-2, ...).
SPECIAL_IDS = ("eos_token_id", "bos_token_id", "pad_token_id")
_POSITIVE = ("vocab_size", "max_position_embeddings")


def override_config(base: Any, overrides: dict[str, Any], where: str) -> Any:
    """``dataclasses.replace(base, **overrides)`` with the rules every tiny config follows.

    * ``max_seq_len`` is the README's spelling of ``max_position_embeddings`` (giving both is an error);
    * an unknown name raises ConfigError listing the valid fields;
    * ``vocab_size`` / ``max_position_embeddings`` must be positive integers;
    * a special-token id (``eos/bos/pad_token_id``) that was *not* given and falls outside the
      (possibly shrunk) vocabulary moves to the top of it: eos -> ``V-1``, bos -> ``V-2``, pad ->
      ``V-3`` (floored at 0; each out-of-range entry of an eos list -> ``V-1``). So
      ``vocab_size=128`` keeps the tiny model usable (its defaults 256/257 would index past the
      embedding). A given id outside ``[0, V)`` raises ConfigError.

    The dataclass's own ``__post_init__`` validates the rest (ConfigError on a bad combination).
    """
    valid = [f.name for f in dataclasses.fields(base)]
    kw: dict[str, Any] = {}
    for name, value in overrides.items():
        field = ALIASES.get(name, name)
        if field not in valid:
            names = ", ".join(sorted(valid + list(ALIASES)))
            raise ConfigError(f"{where}: unknown field '{name}' (valid: {names})")
        if field in kw:
            raise ConfigError(f"{where}: '{name}' and '{field}' name the same field; give one")
        kw[field] = value
    for k in _POSITIVE:
        if k in kw and (not isinstance(kw[k], int) or isinstance(kw[k], bool) or kw[k] <= 0):
            raise ConfigError(f"{where}: '{k}' must be a positive integer, got {kw[k]!r}")
    vocab = kw.get("vocab_size", getattr(base, "vocab_size", None))
    if vocab is not None:
        for rank, k in enumerate(SPECIAL_IDS):
            if not hasattr(base, k):
                continue
            if k in kw:
                ids = kw[k] if isinstance(kw[k], (list, tuple)) else [kw[k]]
                bad = [i for i in ids if i is not None and not 0 <= i < vocab]
                if bad:
                    raise ConfigError(f"{where}: {k}={kw[k]!r} is outside the vocabulary [0, {vocab})")
                continue
            kw[k] = _fit_id(getattr(base, k), vocab, max(vocab - 1 - rank, 0))
    return dataclasses.replace(base, **kw)


def _fit_id(value, vocab: int, top: int):
    """``value`` (an id, a list of ids or None) with ids outside ``[0, vocab)`` replaced by ``top``."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        out: list[int] = []
        for i in value:
            j = i if 0 <= i < vocab else vocab - 1
            if j not in out:
                out.append(j)
        return out
    return value if 0 <= value < vocab else top
