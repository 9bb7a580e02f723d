"""Batched next-token sampling with per-row parameters, and logprobs for the API.

Per row ``b`` (``params[b]``), in this order:

1. greedy (``temperature == 0`` or ``top_k == 1``): ``argmax(logits[b])``;
2. otherwise ``logits[b] / temperature``, then
3. top-k: keep the ``top_k`` largest (off when ``top_k`` is ``-1``/``0`` or ``>= V``);
4. top-p: keep the smallest prefix of the descending-probability order whose mass is
   ``>= top_p`` (a token is kept iff the mass strictly before it is ``< top_p``; so the top token
   is always kept); probabilities are those after top-k;
5. min-p: drop tokens whose probability (after 3-4) is ``< min_p * max probability``;
6. draw from the renormalized distribution using the row's ``torch.Generator`` (or the global
   RNG when it is ``None``).

Shapes: ``logits [B, V]`` (any float dtype; all math in fp32) -> ``tokens [B] int64``.

Invariants: an all-greedy batch is one ``argmax`` (no softmax, no sort); the sort is done once,
only over the rows that need top-k/top-p; the draw is an exponential race
(``argmax(p / E)``, ``E ~ Exp(1)``) whose noise for a seeded row comes only from that row's
generator, so a row's token depends on its own logits, parameters and generator state only —
never on which other rows share the batch.
"""

from __future__ import annotations

from typing import Sequence

import torch

from torchinferno.core.sampling_params import SamplingParams

__all__ = ["make_generator", "sample", "apply_filters", "compute_logprobs"]


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (one per seeded request)."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return gen


def values_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A short host list (per-row parameters, row indices) as a device tensor without a host sync.

    ``torch.tensor(values, device=cuda)`` copies from pageable memory and waits for the stream,
    which would serialize async scheduling (the host must not wait for a step still running); a
    pinned staging tensor copies with ``non_blocking`` instead.
    """
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)


def apply_filters(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p for non-greedy rows.

    ``logits [R, V]`` -> fp32 ``[R, V]`` with removed tokens at ``-inf``; ``params`` has ``R``
    entries, none greedy. Exposed so tests can compare the masks with a reference.
    """
    x = logits.float()
    rows, vocab = x.shape
    device = x.device
    temps = values_to_device([p.temperature for p in params], torch.float32, device)
    x = x / temps.clamp_min(1e-6).unsqueeze(1)  # [R, V]; the clamp keeps tiny temperatures finite

    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [float(p.top_p) for p in params]
    sort_rows = [i for i in range(rows) if top_k[i] < vocab or top_p[i] < 1.0]
    if sort_rows:
        idx = values_to_device(sort_rows, torch.long, device)
        sub = x.index_select(0, idx)  # [S, V]
        sorted_logits, sorted_ids = sub.sort(dim=-1, descending=True)  # [S, V] each
        positions = torch.arange(vocab, device=device).unsqueeze(0)  # [1, V]
        k = values_to_device([top_k[i] for i in sort_rows], torch.long, device).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(positions >= k, float("-inf"))
        # Rows with top_p == 1 get a threshold of 2 so rounding in the cumsum never removes tokens.
        p = values_to_device([top_p[i] if top_p[i] < 1.0 else 2.0 for i in sort_rows],
                         torch.float32, device).unsqueeze(1)  # [S, 1]
        probs = sorted_logits.softmax(dim=-1)  # [S, V]
        mass_before = probs.cumsum(dim=-1) - probs  # [S, V] exclusive cumulative mass
        remove = mass_before >= p
        remove[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        sub = torch.full_like(sub, float("-inf")).scatter(1, sorted_ids, sorted_logits)
        x = x.index_copy(0, idx, sub)

    min_p = [float(p.min_p) for p in params]
    if any(m > 0.0 for m in min_p):
        mp = values_to_device(min_p, torch.float32, device).unsqueeze(1)  # [R, 1]
        probs = x.softmax(dim=-1)  # [R, V]
        threshold = probs.amax(dim=-1, keepdim=True) * mp
        x = x.masked_fill(probs < threshold, float("-inf"))
    return x


def _draw(filtered: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """Exponential race over ``filtered [R, V]`` logits -> ``[R]`` int64 token ids."""
    probs = filtered.softmax(dim=-1)  # [R, V]
    noise = torch.empty_like(probs)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.exponential_()
    else:
        for i, g in enumerate(generators):
            if g is not None:
                noise[i].exponential_(generator=g)
        if unseeded:
            idx = values_to_device(unseeded, torch.long, probs.device)
            noise.index_copy_(0, idx, torch.empty((len(unseeded), probs.shape[1]), device=probs.device).exponential_())
    # E can be exactly 0 in fp32; clamp so p / E stays finite and masked tokens (p == 0) never win.
    return (probs / noise.clamp_min_(1e-20)).argmax(dim=-1)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None] | None = None,
) -> torch.Tensor:
    """Pick one token per row of ``logits [B, V]`` -> ``[B]`` int64 (see the module docstring).

    ``generators[b]`` is the generator of row ``b`` (``None`` = global RNG); it must live on
    ``logits.device``. ``generators`` itself may be ``None`` when no row is seeded.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    batch = logits.shape[0]
    if len(params) != batch:
        raise ValueError(f"got {len(params)} SamplingParams for a batch of {batch}")
    if generators is None:
        generators = [None] * batch
    elif len(generators) != batch:
        raise ValueError(f"got {len(generators)} generators for a batch of {batch}")

    greedy_tokens = logits.argmax(dim=-1)  # [B] int64
    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled_rows:
        return greedy_tokens
    if len(sampled_rows) == batch:
        rows_logits = logits
    else:
        rows_idx = values_to_device(sampled_rows, torch.long, logits.device)
        rows_logits = logits.index_select(0, rows_idx)
    filtered = apply_filters(rows_logits, [params[i] for i in sampled_rows])
    drawn = _draw(filtered, [generators[i] for i in sampled_rows])
    if len(sampled_rows) == batch:
        return drawn
    return greedy_tokens.index_copy(0, rows_idx, drawn)


def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of the raw model distribution (before temperature and filters).

    ``logits [B, V]``, ``token_ids [B]`` -> ``(chosen [B] fp32, topk_ids [B, k] int64,
    topk_logprobs [B, k] fp32)``, top-k sorted descending; ``k == 0`` gives ``[B, 0]`` tensors.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
    chosen = logprobs.gather(1, token_ids.long().view(-1, 1)).squeeze(1)  # [B]
    k = min(k, logprobs.shape[1])
    top_lp, top_ids = logprobs.topk(k, dim=-1)  # [B, k] each
    return chosen, top_ids, top_lp
