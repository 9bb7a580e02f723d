"""IncrementalDetokenizer: streamed deltas must add up to a full decode, never leak a partial
UTF-8 character, and decode only a bounded window per step."""

from __future__ import annotations

import random

import pytest

from torchinferno.text import ByteTokenizer, IncrementalDetokenizer

CJK_EMOJI_TEXT = (
    "Hello 世界! 東京の天気は晴れです。🙂🚀👍🏽 café naïve — 你好，世界。한국어 텍스트 😀😃 ∑∫ "
    "the quick brown fox jumps over the lazy dog 日本語のテキスト🎉\n\tend"
)


def stream(tokenizer, ids, skip_special_tokens=True):
    det = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    deltas = [det.add(i) for i in ids]
    deltas.append(det.flush())
    return deltas


class RecordingTokenizer:
    """Delegates to a tokenizer and records the length of every decode call."""

    def __init__(self, inner):
        self.inner = inner
        self.lengths: list[int] = []
        self.unstable_token_ids = inner.unstable_token_ids
        self.is_special = inner.is_special

    def decode(self, ids, skip_special_tokens=True):
        ids = list(ids)
        self.lengths.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def _tokenizers(request):
    return {
        "byte": ByteTokenizer(),
        "bpe": request.getfixturevalue("bpe_tokenizer"),
        "metaspace": request.getfixturevalue("metaspace_tokenizer"),
    }


@pytest.mark.parametrize("kind", ["byte", "bpe", "metaspace"])
@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_concat_equals_full_decode(request, kind, skip):
    tok = _tokenizers(request)[kind]
    rng = random.Random(1234)
    for trial in range(60):
        n = rng.randint(1, 80)
        ids = [rng.randrange(tok.vocab_size) for _ in range(n)]
        deltas = stream(tok, ids, skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip), (kind, trial, ids)


@pytest.mark.parametrize("skip", [True, False])
def test_byte_fallback_groups_with_specials(metaspace_tokenizer, skip):
    """Byte-fallback pieces decode as a group that becomes all U+FFFD when invalid, even when a
    skipped special token sits inside the group; the stream must agree."""
    tok = metaspace_tokenizer
    byte_ids = sorted(tok.unstable_token_ids)
    assert len(byte_ids) == 256
    rng = random.Random(99)
    for trial in range(150):
        ids = []
        for _ in range(rng.randint(1, 60)):
            r = rng.random()
            if r < 0.6:
                ids.append(rng.choice(byte_ids))
            else:  # specials (<unk>, <s>, </s> are ids 0-2) or anything
                ids.append(rng.randrange(3) if r < 0.75 else rng.randrange(tok.vocab_size))
        assert "".join(stream(tok, ids, skip)) == tok.decode(ids, skip_special_tokens=skip), (trial, ids)


@pytest.mark.parametrize("kind", ["byte", "bpe", "metaspace"])
def test_real_text_no_replacement_char_and_exact(request, kind):
    tok = _tokenizers(request)[kind]
    ids = tok.encode(CJK_EMOJI_TEXT, add_special_tokens=True)
    deltas = stream(tok, ids)
    assert "".join(deltas) == CJK_EMOJI_TEXT
    assert not any("\ufffd" in d for d in deltas)
    # the text really streams (not everything at flush)
    assert sum(1 for d in deltas[:-1] if d) > 10


def test_multibyte_char_held_until_complete():
    tok = ByteTokenizer()
    det = IncrementalDetokenizer(tok)
    euro = "€".encode()  # 3 bytes
    assert det.add(ord("a")) == "a"
    assert det.add(euro[0]) == ""
    assert det.add(euro[1]) == ""
    assert det.add(euro[2]) == "€"
    assert det.flush() == ""


def test_invalid_trailing_bytes_released_by_flush():
    tok = ByteTokenizer()
    ids = list("ok".encode()) + [0xE4, 0xB8]  # an unfinished 3-byte sequence
    deltas = stream(tok, ids)
    assert "".join(deltas[:-1]) == "ok"
    assert deltas[-1] == tok.decode(ids)[2:] and "\ufffd" in deltas[-1]


def test_bytes_interrupted_by_special_token():
    tok = ByteTokenizer()
    ids = [0xE4, tok.EOS, 0xB8, 0xAD] + list("中".encode())
    for skip in (True, False):
        assert "".join(stream(tok, ids, skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_metaspace_leading_space_kept_after_skipped_special(metaspace_tokenizer):
    tok = metaspace_tokenizer
    ids = tok.encode("hello", add_special_tokens=False) + [tok.bos_token_id] + tok.encode(
        "world again", add_special_tokens=False)
    assert "".join(stream(tok, ids)) == tok.decode(ids) == "hello world again"


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_window_stays_small_on_long_streams(request, kind):
    tok = _tokenizers(request)[kind]
    text = CJK_EMOJI_TEXT * 20
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > 1000
    rec = RecordingTokenizer(tok)
    det = IncrementalDetokenizer(rec)
    out = "".join(det.add(i) for i in ids) + det.flush()
    assert out == text
    assert max(rec.lengths) <= 12, max(rec.lengths)
    assert sum(rec.lengths) < 20 * len(ids)


def test_window_bounded_on_long_invalid_byte_runs():
    tok = ByteTokenizer()
    rng = random.Random(7)
    # continuation bytes only: every prefix decodes to U+FFFD runs
    ids = [rng.randrange(0x80, 0xC0) for _ in range(500)] + list("end".encode())
    rec = RecordingTokenizer(tok)
    det = IncrementalDetokenizer(rec)
    out = "".join(det.add(i) for i in ids) + det.flush()
    assert out == tok.decode(ids)
    assert max(rec.lengths) <= 40, max(rec.lengths)


def test_add_after_flush_raises():
    det = IncrementalDetokenizer(ByteTokenizer())
    det.add(65)
    det.flush()
    with pytest.raises(RuntimeError):
        det.add(66)
