"""Batched sampling: greedy, filters vs a plain reference, temperature statistics, seeds."""

from __future__ import annotations

import math

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.text import compute_logprobs, make_generator, sample
from torchinferno.text.sampling import apply_filters


def sp(**kw) -> SamplingParams:
    return SamplingParams(**kw).validate()


# ----- reference implementation (one row at a time, written for clarity) ------------------------
def reference_keep(logits_row: torch.Tensor, p: SamplingParams) -> set[int]:
    x = [v / p.temperature for v in logits_row.double().tolist()]
    keep = set(range(len(x)))
    if p.top_k > 0:
        order = sorted(keep, key=lambda i: -x[i])
        keep = set(order[: p.top_k])
    if p.top_p < 1.0:
        m = max(x[i] for i in keep)
        w = {i: math.exp(x[i] - m) for i in keep}
        z = sum(w.values())
        kept, mass = set(), 0.0
        for i in sorted(keep, key=lambda i: -x[i]):
            kept.add(i)
            mass += w[i] / z
            if mass >= p.top_p:
                break
        keep = kept
    if p.min_p > 0.0:
        m = max(x[i] for i in keep)
        w = {i: math.exp(x[i] - m) for i in keep}  # max weight is 1
        keep = {i for i in keep if w[i] >= p.min_p}
    return keep


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


# ----- greedy ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_equals_argmax(dtype):
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(0)).to(dtype)
    params = [sp(temperature=0.0)] * 4 + [sp(temperature=0.8, top_k=1)] * 4
    out = sample(logits, params, [None] * 8)
    assert out.dtype == torch.int64 and out.shape == (8,)
    assert torch.equal(out, logits.float().argmax(-1))


def test_all_greedy_batch_does_not_sort_or_softmax(monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("fast path must not sort/softmax")

    monkeypatch.setattr(torch.Tensor, "sort", forbidden)
    monkeypatch.setattr(torch.Tensor, "softmax", forbidden)
    logits = torch.randn(4, 50)
    assert torch.equal(sample(logits, [sp(temperature=0.0)] * 4, None), logits.argmax(-1))
    with pytest.raises(AssertionError):  # the patch is live: a sampled row would hit it
        sample(logits, [sp(temperature=1.0, top_k=5)] + [sp(temperature=0.0)] * 3, None)


def test_one_sort_for_all_rows_that_need_it(monkeypatch):
    calls = []
    real_sort = torch.Tensor.sort

    def counting_sort(self, *a, **k):
        calls.append(tuple(self.shape))
        return real_sort(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "sort", counting_sort)
    logits = torch.randn(5, 64)
    params = [sp(top_k=3), sp(temperature=0.0), sp(top_p=0.5), sp(min_p=0.1), sp(temperature=0.7)]
    sample(logits, params, None)
    assert calls == [(2, 64)]  # only the top-k row and the top-p row, in one sort


# ----- filters vs reference --------------------------------------------------------------------
def test_filter_masks_match_reference():
    g = torch.Generator().manual_seed(1)
    params = []
    for i in range(48):
        params.append(sp(
            temperature=[0.3, 0.7, 1.0, 1.5][i % 4],
            top_k=[-1, 1 + i % 7, 0, 20][i % 4 if i % 3 else 1],
            top_p=[1.0, 0.9, 0.5, 0.2, 0.75][i % 5],
            min_p=[0.0, 0.0, 0.05, 0.3][(i // 2) % 4],
        ))
    params = [p for p in params if not p.greedy]
    logits = torch.randn(len(params), 40, generator=g) * 3
    filtered = apply_filters(logits, params)
    assert filtered.dtype == torch.float32
    for b, p in enumerate(params):
        got = set(torch.nonzero(torch.isfinite(filtered[b])).flatten().tolist())
        assert got == reference_keep(logits[b], p), (b, p)
        # kept tokens keep their temperature-scaled logits
        idx = sorted(got)
        torch.testing.assert_close(filtered[b, idx], logits[b, idx] / p.temperature)


def test_top_p_always_keeps_top_token():
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0]])
    filtered = apply_filters(logits, [sp(top_p=0.01)])
    assert torch.isfinite(filtered).tolist() == [[True, False, False, False]]


def test_top_p_is_applied_when_sampling():
    # probs 0.5, 0.3, 0.1, 0.1; top_p=0.7 keeps {0, 1} only. Ignoring top_p would draw 2/3 ~20%.
    logits = torch.tensor([0.5, 0.3, 0.1, 0.1]).log().expand(4000, 4).contiguous()
    out = sample(logits, [sp(top_p=0.7)] * 4000, [make_generator(3, "cpu")] + [None] * 3999)
    counts = torch.bincount(out, minlength=4)
    assert counts[2] == 0 and counts[3] == 0
    assert counts[1] > 1000  # and token 1 really is sampled (~37.5%)


def test_min_p_is_applied_when_sampling():
    logits = torch.tensor([0.6, 0.25, 0.1, 0.05]).log().expand(3000, 4).contiguous()
    torch.manual_seed(0)
    out = sample(logits, [sp(min_p=0.3)] * 3000, None)  # keeps p >= 0.18
    counts = torch.bincount(out, minlength=4)
    assert counts[2] == 0 and counts[3] == 0 and counts[1] > 500


# ----- temperature statistics --------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_distribution(temperature):
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n = 20000
    out = sample(base.expand(n, 5).contiguous(), [sp(temperature=temperature)] * n,
                 [make_generator(1000 + i, "cpu") for i in range(n)])
    counts = torch.bincount(out, minlength=5)
    target = torch.softmax(base / temperature, -1)
    assert chi_square(counts, target) < 25.0  # df=4: p ~ 5e-5 for a correct sampler
    # the statistic can fail: the same counts against a wrong temperature are far off
    wrong = torch.softmax(base / (temperature * 1.5), -1)
    assert chi_square(counts, wrong) > 100.0


# ----- seeds and batch composition --------------------------------------------------------------
def _run_steps(batch_params, seeded_index, seed, steps=6, vocab=300):
    logits_g = torch.Generator().manual_seed(77)
    gens = [make_generator(seed, "cpu") if i == seeded_index else
            (make_generator(5 + i, "cpu") if i % 2 else None) for i in range(len(batch_params))]
    tokens = []
    for _ in range(steps):
        row = torch.randn(vocab, generator=logits_g)
        logits = torch.randn(len(batch_params), vocab)
        logits[seeded_index] = row
        tokens.append(int(sample(logits, batch_params, gens)[seeded_index]))
    return tokens


def test_seed_reproducible_regardless_of_batch():
    target = sp(temperature=1.0, top_p=0.9, top_k=50, seed=42)
    alone = _run_steps([target], 0, 42)
    in_batch = _run_steps([sp(temperature=0.0), sp(temperature=0.5, top_k=3), target, sp(min_p=0.2)], 2, 42)
    big = _run_steps([sp(temperature=1.3)] * 7 + [target], 7, 42)
    assert alone == in_batch == big
    assert _run_steps([target], 0, 43) != alone  # a different seed gives a different stream
    assert len(set(alone)) > 1  # the row really samples


def test_mixed_greedy_and_sampled_rows():
    logits = torch.randn(6, 200, generator=torch.Generator().manual_seed(3))
    params = [sp(temperature=0.0), sp(temperature=1.0), sp(temperature=0.0, top_k=5),
              sp(temperature=0.9, top_k=4), sp(top_k=1), sp(temperature=1.0, top_p=0.3)]
    seen = {1: set(), 3: set()}
    for s in range(30):
        out = sample(logits, params, [make_generator(s * 10 + i, "cpu") for i in range(6)])
        for b in (0, 2, 4):
            assert out[b] == logits[b].argmax()
        assert int(out[3]) in set(logits[3].topk(4).indices.tolist())
        assert int(out[5]) in reference_keep(logits[5], params[5])
        seen[1].add(int(out[1]))
        seen[3].add(int(out[3]))
    assert len(seen[1]) > 5 and len(seen[3]) > 1


def test_low_precision_logits_use_fp32_math():
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(9)).bfloat16()
    params = [sp(temperature=0.8, top_p=0.95), sp(temperature=1.2, min_p=0.01), sp(top_k=20)]
    a = sample(logits, params, [make_generator(i, "cpu") for i in range(3)])
    b = sample(logits.float(), params, [make_generator(i, "cpu") for i in range(3)])
    assert torch.equal(a, b)
    assert apply_filters(logits, params).dtype == torch.float32


def test_shape_errors():
    with pytest.raises(ValueError):
        sample(torch.randn(2, 5), [sp()], None)
    with pytest.raises(ValueError):
        sample(torch.randn(5), [sp()], None)


# ----- logprobs ----------------------------------------------------------------------------------
def test_compute_logprobs():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(2)).half()
    tokens = torch.tensor([0, 5, 29, 7])
    chosen, top_ids, top_lp = compute_logprobs(logits, tokens, 3)
    ref = torch.log_softmax(logits.float(), -1)
    torch.testing.assert_close(chosen, ref[torch.arange(4), tokens])
    assert top_ids.shape == (4, 3) and top_lp.shape == (4, 3) and top_ids.dtype == torch.int64
    torch.testing.assert_close(top_lp, ref.gather(1, top_ids))
    assert torch.equal(top_ids[:, 0], ref.argmax(-1))
    assert bool((top_lp[:, :-1] >= top_lp[:, 1:]).all())
    c0, i0, l0 = compute_logprobs(logits, tokens, 0)
    assert i0.shape == (4, 0) and l0.shape == (4, 0)
    torch.testing.assert_close(c0, chosen)
