"""Shared by the CUDA-graph runner tests (tests/kernels/test_cuda_graphs_*.py, triton_interpreter_checks.py): a tiny
llama3, a paged KV cache filled with random values plus an untouched copy to run the eager reference on, and the mixed
steps (decodes, prefill chunks over cached context, fresh prompts) the piecewise and whole-step runners replay."""

from __future__ import annotations

import torch

from torchinferno.models.common.attention_metadata import AttentionMetadata

# (cached context, new tokens) per sequence, in step order; with buckets (8, 16, 32)
MIXED_STEPS = [
    [(9, 1), (14, 1), (0, 11), (5, 1)],  # decodes + a fresh prompt: 14 tokens -> bucket 16
    [(7, 1), (3, 6)],                    # a decode + a chunk over cached context: 7 tokens -> bucket 8
    [(0, 20), (10, 1), (2, 9)],          # 30 tokens -> bucket 32
    [(12, 1)],                           # one decode after a larger step: stale padded rows
    [(4, 3), (0, 2)],                    # 5 tokens -> bucket 8
]


def tiny_llama(device, dtype, backend=None):
    from torchinferno.testing import tiny_model

    return tiny_model("llama3", dtype=dtype, device=device, attention_backend=backend)


def random_caches(model, num_blocks: int, block_size: int, dtype, device, g: torch.Generator):
    """``(caches, ref)``: the model's per-layer KV tensors of ``num_blocks`` blocks, random (from ``g``), and a clone."""
    caches = model.family.kv_spec(model.config).allocate(num_blocks, block_size, dtype, device)
    for layer in caches:
        for t in layer:
            t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    return caches, [tuple(t.clone() for t in layer) for layer in caches]


def check_mixed_steps(runner, model, caches, ref, g: torch.Generator, device, dtype, block_size: int,
                      num_blocks: int) -> None:
    """Every MIXED_STEPS step through ``runner.run`` == ``model``'s own forward on ``ref`` (a copy of ``caches``): the
    hidden states, and every KV row (the same rows written, nothing else)."""
    t = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 3e-2}[dtype]
    tol = dict(rtol=t, atol=t)
    for shapes in MIXED_STEPS:
        ids, pos, meta = mixed_step(g, model.config.vocab_size, device, shapes, block_size, num_blocks)
        with torch.inference_mode():
            got = runner.run(ids, pos, meta).clone()
            want = model(ids, pos, ref, meta)
        assert got.shape == want.shape == (ids.shape[0], model.config.hidden_size)
        torch.testing.assert_close(got, want, **tol)
        for layer, ref_layer in zip(caches, ref):
            for t, r in zip(layer, ref_layer):
                torch.testing.assert_close(t, r, **tol)


def mixed_step(g: torch.Generator, vocab: int, device, shapes, block_size: int, num_blocks: int):
    """``shapes``: (cached context, new tokens) per sequence -> (ids [T], positions [T], meta); each sequence owns
    distinct random blocks (never block 0)."""
    bs = block_size
    blocks = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    width = max(-(-(c + q) // bs) for c, q in shapes)
    tables, slots, pos, qsl, lens = [], [], [], [0], []
    for c, q in shapes:
        nb = -(-(c + q) // bs)
        row = [blocks.pop() for _ in range(nb)]
        tables.append(row + [0] * (width - nb))
        for p in range(c, c + q):
            slots.append(row[p // bs] * bs + p % bs)
            pos.append(p)
        qsl.append(qsl[-1] + q)
        lens.append(c + q)
    T = qsl[-1]
    i32 = dict(dtype=torch.int32, device=device)
    meta = AttentionMetadata(torch.tensor(qsl, **i32), torch.tensor(lens, **i32),
                             torch.tensor(slots, dtype=torch.long, device=device), torch.tensor(tables, **i32), bs,
                             [q for _, q in shapes], lens, block_tables_host=tables)
    ids = torch.randint(0, vocab, (T,), generator=g).to(device)
    return ids, torch.tensor(pos, dtype=torch.long, device=device), meta
