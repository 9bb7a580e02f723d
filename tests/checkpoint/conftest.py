"""Fixtures for checkpoint tests (helpers live in ckpt_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_fixtures import TinyGGUF, write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> TinyGGUF:
    """The main tiny GGUF (untied, gpt2 BPE tokenizer, pre 'smollm', add_bos_token true)."""
    d = tmp_path_factory.mktemp("gguf_src")
    return write_tiny_gguf(d / "tiny-llama.Q4_1.gguf")


@pytest.fixture(scope="session")
def tiny_gguf_converted(tiny_gguf, tmp_path_factory) -> Path:
    from torchinferno.checkpoint import convert_gguf

    return convert_gguf(tiny_gguf.path, tmp_path_factory.mktemp("gguf_hf") / "out")
