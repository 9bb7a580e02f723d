"""Accuracy of a quantized model against the same checkpoint unquantized: greedy-token agreement and perplexity.

``bench-generate --accuracy`` prints both for its model beside the bf16 model built from the same checkpoint
(for a GGUF: its dequantized weights, so only the quantized multiply differs). The prompts and the text are
held out here (written for this check, in no training set we tune on).

- agreement: for each prompt, greedy decoding of ``n`` tokens by both models; the share of positions, up to
  the first divergence, that match (1.0: identical continuations), and how many continuations are identical.
- perplexity: exp of the mean next-token cross-entropy over :data:`PPL_TEXT` in one causal forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PROMPTS = (
    "The recipe for a simple tomato soup starts with",
    "In 1969, the first humans to walk on the Moon",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Three reasons to learn a second language are",
    "The difference between weather and climate is",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Once upon a time, in a village at the edge of a forest,",
    "To change a flat bicycle tyre, first",
)

PPL_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he could see the "
    "fishing boats returning to the harbour, their lamps swinging as the waves rolled under them. He wrote "
    "the time of each arrival in a worn notebook, a habit he had kept for thirty years. When a storm came in "
    "from the west, he stayed awake through the night, trimming the wick and watching the beam sweep across "
    "the water. In the morning the sea was calm again, and the gulls gathered on the rocks below the tower. "
    "Water boils at one hundred degrees Celsius at sea level, and it freezes at zero. A triangle has three "
    "sides, and the sum of its interior angles is one hundred and eighty degrees."
)


@dataclass
class AccuracyReport:
    token_agreement: float  # matching greedy tokens up to each prompt's first divergence / all tokens
    identical: int  # prompts whose whole continuation matches
    prompts: int
    new_tokens: int
    ppl_ref: float
    ppl_quant: float


def greedy_tokens(model, prompt: list[int], n: int) -> list[int]:
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import StaticGenerator

    gen = StaticGenerator(model, 1, len(prompt) + n)
    out = gen.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return list(out[0].token_ids)


def perplexity(model, ids: list[int]) -> float:
    """exp(mean cross-entropy of token t+1 given tokens <= t) over ``ids`` in one causal forward (no cache)."""
    x = torch.tensor(ids)
    with torch.inference_mode():
        logits = model.compute_logits(model(x, torch.arange(x.numel())))  # [T, V] fp32
    return math.exp(F.cross_entropy(logits[:-1], x[1:]).item())


def compare(ref_model, quant_model, tokenizer, new_tokens: int = 32) -> AccuracyReport:
    """Greedy agreement over :data:`PROMPTS` and perplexity over :data:`PPL_TEXT`, quantized vs reference."""
    match = total = identical = 0
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        a, b = greedy_tokens(ref_model, ids, new_tokens), greedy_tokens(quant_model, ids, new_tokens)
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        match, total, identical = match + same, total + len(a), identical + (same == len(a))
    ids = tokenizer.encode(PPL_TEXT)
    return AccuracyReport(match / total, identical, len(PROMPTS), new_tokens, perplexity(ref_model, ids),
                          perplexity(quant_model, ids))


def format_accuracy(r: AccuracyReport, ref_name: str, name: str) -> str:
    return (f"accuracy {name} vs {ref_name}: greedy tokens agree {100 * r.token_agreement:.1f}% up to first "
            f"divergence ({r.identical}/{r.prompts} continuations of {r.new_tokens} identical); perplexity "
            f"{r.ppl_quant:.3f} vs {r.ppl_ref:.3f} ({100 * (r.ppl_quant / r.ppl_ref - 1):+.2f}%)")
