"""deepseek-v4 equals transformers' DeepseekV4ForCausalLM (fp32, eager) on a tiny random config.

The tiny config has a sliding, two CSA (rate 4, indexer top-3 of up to 12 entries) and an HCA (rate 8) layer, two
hash-routed MoE layers and YaRN on the compress rope; window 6. Every parameter transformers initializes to a
constant is randomized on both sides. Prompts are not multiples of the rates; decode runs past several window,
CSA and HCA boundaries.
"""

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache

from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.deepseek_v4.config import config_to_hf, tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.family import kv_spec
from torchinferno.models.deepseek_v4.model import randomize_untrained_
from torchinferno.models.deepseek_v4.v0 import DeepSeekV4V0

TOL = 1e-5


def hf_model_for(model):
    d = config_to_hf(model.config)
    d.pop("architectures")
    hc = DeepseekV4Config(**d)
    hc._attn_implementation = "eager"
    hm = DeepseekV4ForCausalLM(hc).eval()
    missing, unexpected = hm.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)
    return hm


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    m = randomize_untrained_(DeepSeekV4V0(tiny_deepseek_v4_config()).eval(), seed=1)
    return m, hf_model_for(m)


def cache_for(model, rows: int, block: int = 64):
    return kv_spec(model.config).allocate(rows, block, torch.float32, "cpu")


def run(model, caches, chunks):
    """chunks: list of (row, context_len, token ids list) processed in one forward -> logits of every token."""
    meta = build_attention_metadata([len(t) for _, _, t in chunks], [c for _, c, _ in chunks], [[r] for r, _, _ in chunks], 64)
    ids = torch.tensor([x for _, _, t in chunks for x in t])
    pos = torch.cat([torch.arange(c, c + len(t)) for _, c, t in chunks])
    with torch.no_grad():
        return model.compute_logits(model(ids, pos, caches, meta))


def test_prefill_logits_ragged_batch(pair):
    m, hm = pair
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (37, 19, 5)]
    out = run(m, cache_for(m, 3), [(b, 0, p) for b, p in enumerate(prompts)])
    start = 0
    with torch.no_grad():
        for p in prompts:
            ref = hm(torch.tensor([p]), use_cache=False).logits[0]
            assert (out[start : start + len(p)] - ref).abs().max() < TOL
            start += len(p)
        # the plain forward without a cache is the same single-sequence pass
        plain = m.compute_logits(m(torch.tensor(prompts[0]), torch.arange(37)))
    assert (plain - out[:37]).abs().max() < TOL


def test_cached_decode_matches_transformers_cache(pair):
    m, hm = pair
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 256, (13,), generator=g).tolist()
    cache = DynamicCache(config=hm.config)
    ours = cache_for(m, 1)
    with torch.no_grad():
        ref = hm(torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
    got = run(m, ours, [(0, 0, prompt)])[-1]
    assert (got - ref).abs().max() < TOL
    seq = list(prompt)
    for _ in range(22):  # positions 13..34: several sliding, CSA (4) and HCA (8) boundaries
        tok = int(ref.argmax())
        seq.append(tok)
        with torch.no_grad():
            ref = hm(torch.tensor([[tok]]), cache=cache, use_cache=True).logits[0, -1]
        got = run(m, ours, [(0, len(seq) - 1, [tok])])[-1]
        assert (got - ref).abs().max() < TOL, len(seq)


def test_chunked_prefill_and_mixed_batches_equal_full(pair):
    m, hm = pair
    g = torch.Generator().manual_seed(4)
    a = torch.randint(0, 256, (41,), generator=g).tolist()
    b = torch.randint(0, 256, (23,), generator=g).tolist()
    with torch.no_grad():
        ref_a = hm(torch.tensor([a]), use_cache=False).logits[0]
        ref_b = hm(torch.tensor([b]), use_cache=False).logits[0]
    caches = cache_for(m, 2)
    # uneven chunks, the two sequences interleaved in shared forwards (prefill + chunk mixed)
    steps = [[(0, 0, a[:7])], [(0, 7, a[7:18]), (1, 0, b[:3])], [(1, 3, b[3:22]), (0, 18, a[18:19])],
             [(0, 19, a[19:41]), (1, 22, b[22:23])]]
    got_a, got_b = [], []
    for chunks in steps:
        out = run(m, caches, chunks)
        i = 0
        for row, _, toks in chunks:
            (got_a if row == 0 else got_b).append(out[i : i + len(toks)])
            i += len(toks)
    assert (torch.cat(got_a) - ref_a).abs().max() < TOL
    assert (torch.cat(got_b) - ref_b).abs().max() < TOL


def test_generate_matches_transformers_greedy(pair):
    m, hm = pair
    prompt = torch.tensor([[3, 17, 250, 9, 41, 77, 5, 130, 12, 200, 8]])
    ours = m.generate(prompt, max_new_tokens=16, ignore_eos=True)
    with torch.no_grad():
        ref = hm.generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16, eos_token_id=None)
    assert ours.tolist() == ref.tolist()


def test_paged_prefix_hit_equals_full_pass(pair):
    """A paged cache (block 4, scattered blocks); sequence B reuses A's first 5 blocks (20 tokens: mid HCA window,
    on a CSA boundary) and starts from context 20, as a prefix-cache hit does; then one more block boundary (22)."""
    m, hm = pair
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 256, (22,), generator=g).tolist()
    a = shared + torch.randint(0, 256, (6,), generator=g).tolist()
    b = shared + torch.randint(0, 256, (15,), generator=g).tolist()
    caches = kv_spec(m.config).allocate(32, 4, torch.float32, "cpu")
    table_a = [9, 3, 17, 1, 12, 5, 20]
    table_b = table_a[:5] + [2, 30, 7, 11, 25]
    with torch.no_grad():
        ref = hm(torch.tensor([b]), use_cache=False).logits[0]
        for table, ctx, toks in ((table_a, 0, a), (table_b, 20, b[20:22]), (table_b, 22, b[22:])):
            meta = build_attention_metadata([len(toks)], [ctx], [table], 4)
            out = m.compute_logits(m(torch.tensor(toks), torch.arange(ctx, ctx + len(toks)), caches, meta))
            if table is table_b:
                assert (out - ref[ctx : ctx + len(toks)]).abs().max() < TOL


def test_indexer_ties_break_alike_in_chunked_and_full_passes(pair):
    """With the indexer's queries zeroed every score ties at 0: the earliest visible entries are kept, the same in a
    full pass, a chunked pass and cached decode (transformers' topk order is arbitrary there, so only ours)."""
    m = DeepSeekV4V0(pair[0].config).eval()
    m.load_state_dict(pair[0].state_dict())
    for layer in m.model.layers:
        comp = layer.self_attn.compressor
        if comp is not None and comp.indexer is not None:
            torch.nn.init.zeros_(comp.indexer.q_b_proj.weight)
    g = torch.Generator().manual_seed(6)
    a = torch.randint(0, 256, (43,), generator=g).tolist()
    full = run(m, cache_for(m, 1), [(0, 0, a)])
    caches = cache_for(m, 1)
    parts = [run(m, caches, [(0, 0, a[:9])]), run(m, caches, [(0, 9, a[9:30])])]
    parts += [run(m, caches, [(0, i, a[i : i + 1])]) for i in range(30, 43)]
    assert (torch.cat(parts) - full).abs().max() < TOL
    keep = m.model.layers[1].self_attn.compressor.indexer.select(
        torch.zeros(1, 64), torch.zeros(1, 48), torch.ones(1, 4), torch.zeros(1, 4), torch.randn(10, 16),
        torch.ones(1, 10, dtype=torch.bool))
    assert keep[0].nonzero().flatten().tolist() == [0, 1, 2]
