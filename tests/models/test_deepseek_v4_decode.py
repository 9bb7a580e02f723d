"""DeepSeek-V4's static-shape decode (models/deepseek_v4/decode.py) == the eager per-sequence decode, on CPU.

Batched sequences of different lengths decode 18 steps across sliding-window, CSA (rate 4, indexer top-3) and
HCA (rate 8) window boundaries; the same weights run with ``static_decode`` on and off; logits equal within fp32
tolerance, tokens equal, the caches' written rows (entries at closing slots included) equal. Also through
``CudaGraphDecodeRunner``'s padded bucket with the placeholder host lengths a capture sees (what a graph replays).
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels import sparse_sink_decode as ssd
from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner, backend_supports_graphs
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.family import kv_spec
from torchinferno.models.deepseek_v4.model import randomize_untrained_
from torchinferno.models.deepseek_v4.v0 import DeepSeekV4V0
from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

BS, STEPS = 4, 18
PROMPTS = (3, 10, 17)  # ends inside / at the edge of CSA and HCA windows; the shortest has no entries at first


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=3)


def set_static(model, on: bool) -> None:
    for layer in model.model.layers:
        layer.self_attn.static_decode = on


def run(model, static: bool, mode: str = "module", steps: int = STEPS):
    """Prefill every prompt in one batch, then greedy-decode ``steps`` tokens per row -> (logits [steps, B, V], caches).

    ``mode``: "module" (the model's forward), "emulated" (the graph runner's padded bucket buffers, run eagerly) or
    "runner" (``CudaGraphDecodeRunner.run``: captured graphs on CUDA)."""
    set_static(model, static)
    p = next(model.parameters())
    dev, dtype = p.device, p.dtype
    B = len(PROMPTS)
    per_seq = -(-(max(PROMPTS) + steps) // BS)
    caches = kv_spec(model.config).allocate(num_blocks=per_seq * B + 1, block_size=BS, dtype=dtype, device=dev)
    table = [[1 + per_seq * b + j for j in range(per_seq)][::-1] for b in range(B)]  # non-contiguous blocks
    g = torch.Generator().manual_seed(5)
    ids = [torch.randint(0, 256, (n,), generator=g).to(dev) for n in PROMPTS]
    out = []
    with torch.no_grad():
        meta = build_attention_metadata(list(PROMPTS), [0] * B, table, BS, device=dev)
        h = model(torch.cat(ids), positions_for(list(PROMPTS), [0] * B).to(dev), caches, meta)
        last = torch.cumsum(torch.tensor(PROMPTS), 0).to(dev) - 1
        tok = model.compute_logits(h)[last].argmax(-1)
        gr = None
        if mode != "module":
            gr = CudaGraphDecodeRunner(model, caches, BS, per_seq, batch_sizes=(B + 2,))
            if mode == "runner":
                gr.capture()
        for i in range(steps):
            ctx = [n + i for n in PROMPTS]
            meta = build_attention_metadata([1] * B, ctx, table, BS, device=dev)
            pos = torch.tensor(ctx, device=dev)
            if gr is None:
                logits = model.compute_logits(model(tok, pos, caches, meta))
            elif mode == "runner":
                logits = gr.run(tok, pos, meta.slot_mapping, meta.block_tables, meta.seq_lens).clone()
            else:  # the bucket's static buffers: padded rows, full-width table, placeholder host lengths
                gr._load(tok, pos, meta.slot_mapping, meta.block_tables, meta.seq_lens, B + 2)
                logits = gr._forward(B + 2)[:B].clone()
            out.append(logits.float())
            tok = logits.argmax(-1)
    set_static(model, True)
    if mode == "runner":
        assert gr.use_graphs == (dev.type == "cuda") and gr.num_replays == (steps if gr.use_graphs else 0)
    return torch.stack(out), caches


def test_v1_declares_capture_and_v0_does_not(model):
    assert backend_supports_graphs(model)
    assert not backend_supports_graphs(DeepSeekV4V0(tiny_deepseek_v4_config()))


@pytest.mark.parametrize("mode", ["module", "emulated"])
def test_static_decode_equals_eager(model, mode):
    want, want_caches = run(model, static=False)
    got, got_caches = run(model, static=True, mode=mode)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for layer_w, layer_g in zip(want_caches, got_caches):
        for w, g in zip(layer_w, layer_g):
            torch.testing.assert_close(g[1:], w[1:], rtol=1e-5, atol=1e-5)  # block 0: the bucket's scratch block


def test_reference_attention_masks_and_sinks():
    """The torch reference: masked rows count for nothing, no rows at all gives 0, the sink only dilutes."""
    g = torch.Generator().manual_seed(0)
    B, H, D = 2, 3, 8
    q = torch.randn(B, H, D, generator=g)
    cache = torch.randn(4, 4, D, generator=g)
    sinks = torch.randn(H, generator=g)
    win = torch.tensor([[0, 5, -1], [-1, -1, -1]])
    ent = torch.tensor([[9, -1], [-1, -1]])
    out = ssd.reference(q, cache, win, cache, ent, sinks, 0.5)
    assert torch.equal(out[1], torch.zeros(H, D))
    rows = cache.flatten(0, 1)[[0, 5, 9]]
    logits = torch.einsum("hd,kd->hk", q[0], rows) * 0.5
    p = torch.softmax(torch.cat([logits, sinks[:, None]], -1), -1)[:, :-1]
    torch.testing.assert_close(out[0], p @ rows)


def test_batch_invariant_keeps_the_per_sequence_decode():
    """Batch invariance decodes each sequence alone (the eager path), so it declares no capture."""
    from torchinferno.kernels.batch_invariant import make_batch_invariant
    from torchinferno.models.deepseek_v4 import decode

    m = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=3)
    make_batch_invariant(m)
    assert not backend_supports_graphs(m)
    calls = []
    real = decode.decode_attention
    decode.decode_attention = lambda *a: calls.append(1) or real(*a)
    try:
        run(m, static=True)
    finally:
        decode.decode_attention = real
    assert not calls
