"""Tokenizer.token_bytes: a token's own bytes, also when it holds part of a UTF-8 character (issue 18, item 4)."""

import pytest

from torchinferno.testing import wide_byte_tokenizer
from torchinferno.text.byte_tokenizer import ByteTokenizer

TEXTS = ["hello world", "café über naïve", "日本語 テキスト", "🙂🚀👍🏽 ok", "привет мир ß €"]


def test_byte_tokenizer_gives_each_byte():
    tok = ByteTokenizer()
    ids = tok.encode("é🙂", add_special_tokens=False)
    assert [tok.token_bytes(i) for i in ids] == [bytes([b]) for b in "é🙂".encode()]
    assert tok.token_bytes(tok.EOS) == b"<eos>"
    assert wide_byte_tokenizer().token_bytes(259) == b"@" and wide_byte_tokenizer().token_bytes(0xC3) == b"\xc3"


@pytest.mark.parametrize("text", TEXTS)
def test_bpe_token_bytes_concatenate_to_the_text(bpe_tokenizer_dir, text):
    from torchinferno.text.hf_tokenizer import HFTokenizer

    tok = HFTokenizer(bpe_tokenizer_dir)
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_bpe_partial_character_is_not_replacement(bpe_tokenizer_dir):
    from torchinferno.text.hf_tokenizer import HFTokenizer

    tok = HFTokenizer(bpe_tokenizer_dir)
    partial = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i], skip_special_tokens=False)]
    assert partial, "the test tokenizer has tokens that split a character"
    for i in partial[:50]:
        b = tok.token_bytes(i)
        assert "\ufffd".encode() not in b and len(b) >= 1
    assert tok.token_bytes(tok.encode("<|im_end|>", add_special_tokens=False)[0]) == b"<|im_end|>"
