"""Tokenizers: the ``Tokenizer`` interface, its implementations and ``load_tokenizer``.

``Tokenizer`` (abstract), ``ByteTokenizer`` (no files) and ``HFTokenizer`` (a ``tokenizer.json``
directory) live in their own modules and are re-exported here; import them from this module.
"""

from __future__ import annotations

from pathlib import Path

from torchinferno.errors import TokenizerError
from torchinferno.text.base import Tokenizer
from torchinferno.text.byte_tokenizer import ByteTokenizer
from torchinferno.text.hf_tokenizer import HFTokenizer

__all__ = ["Tokenizer", "ByteTokenizer", "HFTokenizer", "load_tokenizer"]

_ACCEPTED = "'byte', a directory containing tokenizer.json, or a path to a tokenizer.json file"


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """Build a tokenizer from ``spec``.

    * ``"byte"`` -> :class:`ByteTokenizer`
    * a directory with ``tokenizer.json`` -> :class:`HFTokenizer` of that directory
    * a path to a ``tokenizer.json`` file -> :class:`HFTokenizer` of its directory
    * anything else -> ``TokenizerError`` naming what is accepted
    """
    if isinstance(spec, Tokenizer):
        return spec
    if not isinstance(spec, (str, Path)):
        raise TokenizerError(f"tokenizer must be {_ACCEPTED}; got {type(spec).__name__}")
    if isinstance(spec, str) and spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return HFTokenizer(path)
        raise TokenizerError(f"{path} has no tokenizer.json; expected {_ACCEPTED}")
    if path.is_file() and path.name == "tokenizer.json":
        return HFTokenizer(path.parent)
    raise TokenizerError(f"unknown tokenizer {str(spec)!r}; expected {_ACCEPTED}")
