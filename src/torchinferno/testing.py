"""Helpers for tests and experiments: tiny random models of any family, built in-process."""

from __future__ import annotations

import torch

from torchinferno.models.registry import get_family


def tiny_model(family: str = "llama3", size: str = "debug", seed: int = 0, dtype: torch.dtype = torch.float32,
               variant: str | None = None, device: str = "cpu", attention_backend=None):
    """A randomly initialized model of a named size (default ``debug``), with ``.family`` set.

    ``attention_backend`` is passed to ``family.build`` when given (GQA families only).

    Norm weights are drawn in [0.5, 1.5] and matrices from N(0, 0.08) so that a missed or
    mis-mapped tensor changes the logits (ones/zeros would hide it).
    """
    fam = get_family(family)
    torch.manual_seed(seed)
    kw = {} if variant is None else {"variant": variant}
    if attention_backend is not None:
        kw["attention_backend"] = attention_backend
    m = randomize_(fam.build(fam.size(size), device=device, **kw).to(dtype).eval())
    m.family = fam
    return m


def randomize_(module: torch.nn.Module, correction_bias: float | None = None) -> torch.nn.Module:
    """In place: norm weights ~ U[0.5, 1.5], matrices ~ N(0, 0.08); with ``correction_bias``, MoE
    ``e_score_correction_bias`` buffers ~ U[-b, b] (transformers initializes them to zero).

    Works on our models and on transformers' alike, so both sides of an oracle test get the same
    treatment."""
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif p.dim() >= 2:
                p.normal_(0, 0.08)
        if correction_bias is not None:
            for n, b in module.named_buffers():
                if n.endswith("e_score_correction_bias"):
                    b.uniform_(-correction_bias, correction_bias)
    return module


def wide_byte_tokenizer(vocab_size: int = 320):
    """A ``ByteTokenizer`` for a random model's whole vocabulary (default: the tiny models' 320): ids from 259
    (beyond the bytes and the three specials) decode to the printable bytes 0x40..0x7e in turn, so every
    sampled id has text (stop-string tests; serving benchmarks of full-size random models)."""
    from torchinferno.text.byte_tokenizer import ByteTokenizer

    class WideByteTokenizer(ByteTokenizer):
        @property
        def vocab_size(self) -> int:
            return vocab_size

        def decode(self, ids, skip_special_tokens=True):
            ids = [int(i) for i in ids]
            return super().decode([(i - 259) % 63 + 0x40 if i >= 259 else i for i in ids], skip_special_tokens)

        def is_special(self, token_id):
            return int(token_id) in (256, 257, 258)

        def token_bytes(self, token_id):
            i = int(token_id)
            return super().token_bytes(i) if i < 259 else bytes([(i - 259) % 63 + 0x40])

    return WideByteTokenizer()
