"""Shared fixtures for text tests: small byte-level BPE tokenizer directories built on the fly.

``bpe_tokenizer_dir`` (session-scoped) is a SmolLM2-style ChatML tokenizer directory
(tokenizer.json + tokenizer_config.json); ``make_bpe_tokenizer_dir(path, **options)`` builds
variants. Nothing is downloaded; training takes well under a second.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_WORDS = (
    "the quick brown fox jumps over lazy dog hello world token model inference engine batch cache "
    "attention layer python torch tensor sample stream text über naïve café résumé façade "
    "日本語 テキスト 東京 中文 字符 你好 世界 한국어 안녕하세요 привет мир γειά σου 🙂 🚀 🎉 👍🏽 ñ ß € ©"
).split()


def training_corpus(n: int = 400, seed: int = 0) -> list[str]:
    """A few hundred short mixed-script sentences (ASCII, accents, CJK, Hangul, emoji)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        sep = rng.choice([" ", " ", " ", "", ", "])
        line = sep.join(words)
        if rng.random() < 0.3:
            line = line.capitalize() + rng.choice([".", "!", "?", "\n", "  "])
        lines.append(line)
    return lines


def make_bpe_tokenizer_dir(
    path: Path,
    *,
    vocab_size: int = 800,
    bos_in_postprocessor: bool = False,
    template_in_jinja_file: bool = False,
    tokenizer_class: str = "PreTrainedTokenizerFast",
    extra_config: dict | None = None,
    generation_eos: int | list[int] | None = None,
) -> Path:
    """Train a byte-level BPE and save a HF-style tokenizer directory at ``path``.

    Options: ``bos_in_postprocessor`` makes encode(add_special_tokens=True) prepend
    ``<|endoftext|>`` (Llama-style); ``template_in_jinja_file`` writes the chat template to
    ``chat_template.jinja`` instead of the config (transformers 5 layout); ``generation_eos``
    writes a generation_config.json with that ``eos_token_id``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    if bos_in_postprocessor:
        bos_id = tok.token_to_id("<|endoftext|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", pair="<|endoftext|> $A <|endoftext|> $B",
            special_tokens=[("<|endoftext|>", bos_id)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(path / "tokenizer.json"))

    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": tokenizer_class,
        "added_tokens_decoder": added,
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "extra_special_tokens": {},
    }
    if template_in_jinja_file:
        (path / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE, encoding="utf-8")
    else:
        config["chat_template"] = SMOLLM2_TEMPLATE
    config.update(extra_config or {})
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    if generation_eos is not None:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory) -> Path:
    """A SmolLM2-like ChatML byte-level BPE tokenizer directory (template in tokenizer_config.json)."""
    return make_bpe_tokenizer_dir(tmp_path_factory.mktemp("bpe_chatml"))


@pytest.fixture(scope="session")
def bpe_tokenizer(bpe_tokenizer_dir):
    """``HFTokenizer`` over ``bpe_tokenizer_dir``."""
    from torchinferno.text import HFTokenizer

    return HFTokenizer(bpe_tokenizer_dir)


@pytest.fixture(scope="session")
def sample_texts() -> list[str]:
    """Texts with ASCII, accents, CJK, emoji (incl. modifiers), whitespace runs and special tokens."""
    return [
        "",
        "hello world",
        "  leading and trailing  ",
        "The quick brown fox, über café!",
        "日本語のテキスト 東京 你好世界",
        "emoji 🙂🚀 and skin tone 👍🏽 done",
        "mixed\nlines\n\n\ttabs",
        "<|im_start|>user\nhi<|im_end|>\n",
        "text<|endoftext|>more text",
        "unseen: Ωμέγα ∑∫ 😀😃 ⊕",
    ]


@pytest.fixture
def bpe_tokenizer_factory(tmp_path):
    """Call with ``make_bpe_tokenizer_dir`` options to get a fresh variant directory."""
    counter = iter(range(10_000))

    def build(**options) -> Path:
        return make_bpe_tokenizer_dir(tmp_path / f"tok{next(counter)}", **options)

    return build


def make_metaspace_tokenizer_dir(path: Path, vocab_size: int = 600) -> Path:
    """A Llama-2-like SentencePiece-style BPE: ``▁`` for spaces, ``<0xNN>`` byte fallback, a decoder
    that strips the first leading space; ``<s>`` prepended by the post-processor."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # Train on text without the rarest symbols so byte fallback is exercised for them.
    corpus = [line for line in training_corpus() if "🚀" not in line and "€" not in line]
    base = Tokenizer(models.BPE())
    base.normalizer = normalizers.Replace(" ", "▁")
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    base.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(base.to_str())["model"]
    vocab = dict(trained["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "clean_up_tokenization_spaces": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def metaspace_tokenizer(tmp_path_factory):
    """``HFTokenizer`` over a SentencePiece-style byte-fallback tokenizer (see ``make_metaspace_tokenizer_dir``)."""
    from torchinferno.text import HFTokenizer

    return HFTokenizer(make_metaspace_tokenizer_dir(tmp_path_factory.mktemp("metaspace")))


@pytest.fixture(scope="session")
def bpe_dir_builder():
    """``make_bpe_tokenizer_dir`` itself, for fixtures of any scope (avoids ``import conftest``)."""
    return make_bpe_tokenizer_dir
