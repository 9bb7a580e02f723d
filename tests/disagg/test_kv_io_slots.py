"""``kv_io._tensors`` builds only the slot lists the selected tensors (``which``) use, and each tensor's slots equal
the old all-at-once construction (kept here as the reference) for every subset, packed or not."""

import random

import pytest
import torch

from torchinferno.cache.kv_cache import allocate_kv_cache
from torchinferno.disagg import kv_io
from torchinferno.disagg.kv_io import _closing, _sliding_start, _tensors, all_tensors, pack_kv, token_slots
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.family import kv_spec
from torchinferno.models.protocol import packed_slot

BS = 4


def old_tensors(kv, block_ids, sliding_block_ids, start, stop, which):
    """The pre-follow-up construction: every slot list of the group, then the selected tensors'."""
    whole = token_slots(block_ids, kv.block_size, start, stop, kv.device)
    sliding = token_slots(sliding_block_ids, kv.block_size, _sliding_start(kv, start, stop), stop, kv.device)
    ids, bs = torch.tensor(block_ids, dtype=torch.long), kv.block_size
    out = []
    for li, ti in which:
        spec = kv.spec.layers[li]
        name, t = spec.tensors[ti][0], kv.tensors[li][ti]
        rates = dict(spec.rates)
        if spec.is_sliding(name):
            out.append((t, sliding))
        elif name in rates:
            pos = _closing(start, stop, rates[name])
            out.append((t, packed_slot(ids[pos // bs], pos, bs, t.shape[1])))
        else:
            out.append((t, whole))
    return out


def v4_cache(pack):
    return allocate_kv_cache(kv_spec(tiny_deepseek_v4_config()), BS, torch.float32, "cpu", num_blocks=24,
                             num_sliding_blocks=24, pack=pack)


@pytest.mark.parametrize("pack", [False, True])
def test_slots_of_every_subset_equal_the_old_construction(pack):
    kv = v4_cache(pack)
    every = all_tensors(kv)
    rng = random.Random(5)
    for _ in range(60):
        n_blocks = rng.randint(1, 12)
        block_ids = rng.sample(range(24), n_blocks)
        sliding = rng.sample(range(24), n_blocks)
        stop = rng.randint(1, n_blocks * BS)
        start = rng.randint(0, stop)
        which = tuple(w for w in every if rng.random() < 0.5)
        got = _tensors(kv, block_ids, sliding, start, stop, which)
        want = old_tensors(kv, block_ids, sliding, start, stop, which)
        assert len(got) == len(want)
        for (t, s), (t0, s0) in zip(got, want):
            assert t is t0 and torch.equal(s, s0)


def test_a_sliding_only_part_builds_no_whole_group_slots(monkeypatch):
    kv = v4_cache(False)
    for layer in kv.tensors:
        for t in layer:
            t.copy_(torch.randn(t.shape))
    calls = []
    real = kv_io.token_slots
    monkeypatch.setattr(kv_io, "token_slots", lambda ids, *a: calls.append(list(ids)) or real(ids, *a))
    every = all_tensors(kv)
    kinds = {}
    for li, ti in every:
        spec = kv.spec.layers[li]
        name = spec.tensors[ti][0]
        kinds[li, ti] = "sliding" if spec.is_sliding(name) else "rate" if name in dict(spec.rates) else "whole"
    part = {k: tuple(w for w in every if kinds[w] == k) for k in ("sliding", "rate", "whole")}
    assert part["sliding"] and part["rate"] and not part["whole"]  # V4: every whole-group tensor has a rate
    block_ids, sliding = list(range(6)), list(range(10, 16))
    for k, want in (("sliding", [sliding]), ("rate", [])):
        calls.clear()
        pack_kv(kv, block_ids, 0, 22, part[k], sliding)
        assert calls == want  # one slot list, built once for every tensor of the part
    calls.clear()
    full = pack_kv(kv, block_ids, 0, 22, None, sliding)
    assert calls == [sliding]  # no per-token whole-group slots: no tensor reads them
    # the parts' buffers are the whole buffer's pieces (pack order = every tensor in order)
    parts = {w: pack_kv(kv, block_ids, 0, 22, (w,), sliding) for w in every}
    assert torch.equal(full, torch.cat([parts[w] for w in every]))
