"""Text side of generation: tokenizers, chat templates, streaming detokenization, stop strings
and batched sampling. Importing this package has no side effects."""

from torchinferno.text.detokenizer import IncrementalDetokenizer
from torchinferno.text.sampling import compute_logprobs, make_generator, sample
from torchinferno.text.stop import StopChecker
from torchinferno.text.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "Tokenizer",
    "ByteTokenizer",
    "HFTokenizer",
    "load_tokenizer",
    "IncrementalDetokenizer",
    "StopChecker",
    "sample",
    "make_generator",
    "compute_logprobs",
]
