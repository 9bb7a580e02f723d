"""ByteTokenizer: ids are UTF-8 bytes plus three specials; built-in jinja chat template."""

from __future__ import annotations

import random

import pytest

from torchinferno.errors import TokenizerError
from torchinferno.text import ByteTokenizer, Tokenizer


def test_interface_and_ids():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 259
    assert (tok.bos_token_id, tok.eos_token_ids) == (256, [257])
    assert tok.encode("A€", add_special_tokens=False) == [65, 0xE2, 0x82, 0xAC]
    assert tok.encode("A", add_special_tokens=True) == [256, 65]


def test_roundtrip_random_unicode():
    tok = ByteTokenizer()
    rng = random.Random(0)
    for _ in range(200):
        s = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x800),
                                    rng.randrange(0x4E00, 0x9FFF), rng.randrange(0x1F300, 0x1FAFF)]))
                    for _ in range(rng.randint(0, 20)))
        assert tok.decode(tok.encode(s)) == s
        assert tok.decode(tok.encode(s, add_special_tokens=False), skip_special_tokens=False) == s


def test_special_strings_and_skipping():
    tok = ByteTokenizer()
    ids = tok.encode("a<eos>b<pad>", add_special_tokens=False)
    assert ids == [97, 257, 98, 258]
    assert tok.decode(ids, skip_special_tokens=False) == "a<eos>b<pad>"
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert tok.is_special(257) and not tok.is_special(255)
    assert tok.id_to_piece(0x41) == "<0x41>" and tok.id_to_piece(256) == "<bos>"


def test_invalid_utf8_is_replaced():
    tok = ByteTokenizer()
    assert tok.decode([0xE4, 0xB8]) == "\ufffd"
    assert tok.decode([0xFF, 65]) == "\ufffdA"


def test_chat_template_and_encode_chat():
    tok = ByteTokenizer()
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "héllo"}]
    text = tok.apply_chat_template(msgs)
    assert text == "<bos><|system|>\nsys<eos>\n<|user|>\nhéllo<eos>\n<|assistant|>\n"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("héllo<eos>\n")
    ids = tok.encode_chat(msgs)
    assert ids[0] == 256 and ids.count(256) == 1 and ids.count(257) == 2
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_out_of_range_and_bad_messages():
    tok = ByteTokenizer()
    with pytest.raises(TokenizerError):
        tok.decode([259])
    with pytest.raises(TokenizerError):
        tok.decode([-1])
    with pytest.raises(TokenizerError):
        tok.apply_chat_template([])
    with pytest.raises(TokenizerError):
        tok.apply_chat_template(["not a dict"])
