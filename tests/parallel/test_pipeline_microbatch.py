"""Pipeline micro-batches: the grouping of a step's sequences, and ``AttentionMetadata.sub_batch`` (a group's
metadata on its own) giving every family the same hidden states as the whole batch — what lets a stage run the
groups one after another while the next stage works on the previous one."""

import pytest
import torch

from torchinferno.cache.kv_cache import allocate_kv_cache
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.parallel.pipeline import micro_batches
from torchinferno.testing import tiny_model


def test_groups_are_whole_sequences_balanced_by_tokens():
    meta = build_attention_metadata([10, 1, 1, 12, 1, 7], [0, 5, 9, 0, 3, 4], [[0], [1], [2], [3], [4], [5, 6]], 16)
    groups = micro_batches(meta, 2)
    assert groups == [(0, 3, 0, 12), (3, 6, 12, 32)]  # 12 | 20 tokens: the boundary nearest half of 32
    assert [g[:2] for g in micro_batches(meta, 4)] == [(0, 1), (1, 3), (3, 4), (4, 6)]
    assert micro_batches(meta, 1) == [(0, 6, 0, 32)]
    assert len(micro_batches(meta, 99)) == 6  # at most one group per sequence
    one = build_attention_metadata([5], [0], [[0]], 16)
    assert micro_batches(one, 2) == [(0, 1, 0, 5)]
    for k in (2, 3, 5):  # contiguous, covering, non-empty
        gs = micro_batches(meta, k)
        assert gs[0][0] == 0 and gs[-1][1] == 6 and all(a[1] == b[0] and a[3] == b[2] for a, b in zip(gs, gs[1:]))
        assert all(b1 > b0 for b0, b1, _, _ in gs)


@pytest.mark.parametrize("family", ["llama3", "deepseek-v3.2", "dsv4", "deepseek-v4"])
def test_sub_batches_give_the_whole_batch_hidden_states(family):
    torch.manual_seed(0)
    model = tiny_model(family, seed=0)
    spec = model.family.kv_spec(model.config)
    qlens, ctxs = [6, 1, 9, 1], [0, 4, 0, 7]
    tables = [[0, 1], [2], [3, 4], [5, 6]]
    bs = 8

    def caches():
        kv = allocate_kv_cache(spec, bs, torch.float32, "cpu", num_blocks=8)
        for layer in kv.tensors:
            for t in layer:
                t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(3)))  # same context both runs
        return kv

    meta = build_attention_metadata(qlens, ctxs, tables, bs)
    ids = torch.randint(3, 200, (sum(qlens),), generator=torch.Generator().manual_seed(1))
    pos = positions_for(qlens, ctxs)
    with torch.inference_mode():
        kv_whole = caches()
        whole = model(ids, pos, kv_whole.tensors, meta)
        kv_groups = caches()
        parts = []
        for b0, b1, t0, t1 in micro_batches(meta, 3):
            parts.append(model(ids[t0:t1], pos[t0:t1], kv_groups.tensors, meta.sub_batch(b0, b1)))
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-5, rtol=1e-5)
    for a, b in zip(kv_whole.tensors, kv_groups.tensors):  # the same KV written
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y)
