"""The engine hooks of a prefill -> decode handoff, in one process (no transport): a request prefilled on one
engine (``hold_kv``), its live KV rows packed (``disagg.kv_io``) and unpacked into blocks the other engine
reserved (``reserve_prefilled`` / ``add_prefilled``), decodes to the same tokens as one colocated engine, for
every family, greedy and seeded, with decode-side prefix hits; the payload is exactly the live tokens' bytes.
deepseek-v4: the decode side hits what it received or computed wherever the hit's window is there (a hit never
reads an unreceived or given-back row: every such row is poisoned), and nowhere else (r2)."""

import dataclasses
import math

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.disagg.kv_io import _sliding_start, live_kv_bytes, pack_kv, payload_bytes, unpack_kv
from torchinferno.engine.assembly import ModelSpec, build_model
from torchinferno.engine.core_types import EngineCoreRequest
from torchinferno.engine.llm_engine import LLMEngine

FAMILIES = ["llama3", "deepseek", "dsv4", "deepseek-v4"]  # deepseek = DeepSeek-V3.2 (MLA + DSA indexer)


def engine(family, blocks=40, max_model_len=64, **kw):
    model = build_model(ModelSpec(model_kind=family, dtype="float32"))
    return LLMEngine(model, block_size=4, max_model_len=max_model_len, num_gpu_blocks=blocks, **kw)


def prompts():
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 200, (9,), generator=g).tolist()
    # r4 extends r0: on the decode side it hits r0's three full blocks (for deepseek-v4 too: the window [4, 12)
    # that boundary needs is exactly the sliding rows r0 received)
    return [shared + [5, 6, 7], torch.randint(0, 200, (6,), generator=g).tolist(), shared + [9], shared[:8],
            shared + [5, 6, 7, 8, 1, 2]]


def colocated(eng, params):
    for i, p in enumerate(prompts()):
        eng.add_request(f"r{i}", p, params[i])
    done = eng.run_to_completion()
    return [done[f"r{i}"].token_ids for i in range(len(prompts()))]


def sliding_ids(eng, req):
    """A hybrid KV cache's (deepseek-v4) sliding-group blocks of ``req``, else None."""
    return None if eng.core.sliding_pool is None else req.sliding_block_ids


def handoff(pre, dec, rid, prompt, params):
    """One handoff: prefill ``prompt`` on ``pre`` (first token), move its live rows into the blocks ``dec``
    reserved, start it decoding there -> the rows ``(start, stop)`` moved."""
    pc, dc = pre.core, dec.core
    pc.add_request(EngineCoreRequest(rid, prompt, dataclasses.replace(params, max_tokens=1)), hold_kv=True)
    tok = None
    while pc.has_unfinished():
        for o in pc.step():
            tok = o.new_token_ids[0]
    held = pc.scheduler.held[rid]
    req = dc.make_request(EngineCoreRequest(rid, prompt, params))
    req.output_token_ids.append(tok)
    req.num_prior_draws = 1
    start, stop = dc.scheduler.reserve_prefilled(req)
    buf = pack_kv(pre.executor.kv_cache, held.block_ids, start, stop, sliding_block_ids=sliding_ids(pre, held))
    kv = dec.executor.kv_cache
    assert buf.numel() == payload_bytes(kv, start, stop)
    if kv.spec.is_hybrid:  # deepseek-v4: the sliding group moves the window's blocks, entries their windows'
        W, bs = kv.spec.sliding_window, kv.block_size
        s0 = max(start, (stop - W) // bs * bs)
        rows = {False: stop - start, True: stop - s0}
        want = 0
        for layer in kv.spec.layers:
            for name, shape in layer.tensors:
                m = dict(layer.rates).get(name)
                n = (stop // m - start // m) if m else rows[layer.is_sliding(name)]
                want += n * math.prod(shape) * kv.tensors[0][0].element_size()
        assert buf.numel() == want and (want < (stop - start) * kv.bytes_per_token or start == stop)
    else:
        assert buf.numel() == live_kv_bytes(kv, stop - start)
        assert buf.numel() == (stop - start) * kv.bytes_per_token  # the KVSpec's bytes
    unpack_kv(kv, req.block_ids, start, stop, buf, sliding_block_ids=sliding_ids(dec, req))
    dc.scheduler.add_prefilled(rid)
    assert pc.scheduler.release_held(rid)
    return start, stop


def decode_all(dec):
    toks: dict[str, list[int]] = {}
    while dec.core.has_unfinished():
        for o in dec.core.step():
            toks.setdefault(o.request_id, []).extend(o.new_token_ids)
    return toks


def disaggregated(pre, dec, params):
    """Sequential handoffs (each request: prefill, transfer, then all decode together)."""
    moved = [handoff(pre, dec, f"r{i}", p, params[i]) for i, p in enumerate(prompts())]
    return moved, decode_all(dec)


@pytest.mark.parametrize("family,kv", [(f, "auto") for f in FAMILIES] + [("llama3", "fp8")])
def test_disaggregated_tokens_equal_colocated(family, kv):
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
    params = [greedy, seeded, greedy, seeded, greedy]
    ref = colocated(engine(family, kv_cache_dtype=kv), params)
    pre, dec = engine(family, kv_cache_dtype=kv), engine(family, kv_cache_dtype=kv)
    assert str(pre.executor.kv_cache.dtype) == ("torch.float8_e4m3fn" if kv == "fp8" else "torch.float32")
    moved, toks = disaggregated(pre, dec, params)
    got = [toks[f"r{i}"] for i in range(len(ref))]
    # the decode engine's outputs start at the second token; the first came from the prefill engine
    assert [r[1:] for r in ref] == got
    # r2 shares r0's first two full blocks on the decode side; a hybrid cache (deepseek-v4) received only the
    # window's sliding blocks of r0 ([4, 12)), so the window [0, 8) that hit needs is not there: r2 moves whole
    # r2's 10 rows are all within its window, so r3 (shared[:8]) hits r2's two blocks everywhere, and r4 hits r0's
    # three: their window [4, 12) is r0's received rows.
    hybrid = dec.executor.kv_cache.spec.is_hybrid
    assert moved[0] == (0, 12) and moved[2][0] == (0 if hybrid else 8) and moved[3:] == [(8, 8), (12, 15)]
    assert dec.core.pool.prefix_hits == 8 + (0 if hybrid else 8) + 12
    assert pre.core.scheduler.held == {} and pre.core.pool.num_free == pre.core.pool.num_blocks
    assert dec.core.pool.num_free == dec.core.pool.num_blocks
    for sp in (pre.core.sliding_pool, dec.core.sliding_pool):
        assert sp is None or sp.num_free == sp.num_blocks


def test_backpressure_reserve_waits_for_blocks_and_changes_nothing():
    dec = engine("llama3", blocks=6, max_model_len=24)
    sch, pool = dec.core.scheduler, dec.core.pool
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def handoff(rid, prompt):
        req = dec.core.make_request(EngineCoreRequest(rid, prompt, params))
        req.output_token_ids.append(1)
        return req

    a = handoff("a", list(range(10, 26)))  # 16 tokens: 4 of the 6 blocks
    assert sch.reserve_prefilled(a) == (0, 16)
    sch.add_prefilled("a")
    b = handoff("b", list(range(30, 37)))  # needs 2 blocks; 2 free, but "a" keeps one spare for its next token
    free = pool.num_free
    assert sch.reserve_prefilled(b) is None and pool.num_free == free and "b" not in sch.reserved
    while dec.core.has_unfinished():
        dec.core.step()
    assert sch.reserve_prefilled(b) == (0, 7)
    assert sch.drop_reserved("b") and pool.num_free == pool.num_blocks


POISON = 1.0e4  # finite: a batched step reads (and masks to weight 0) rows past a shorter sequence's end; NaN would
# leak through those 0 weights, a large finite row only changes the tokens where it is really attended to / pooled


def poison(eng):
    """POISON into every cache block before use and into every block a pool hands out (fresh or evicted) or takes
    back uncached: the decode side may then only read rows it received, computed, or hit in its prefix cache."""
    kv = eng.executor.kv_cache
    for layer in kv.tensors:
        for t in layer:
            t.fill_(POISON)

    def fill(ids, sliding):
        for layer, tensors in zip(kv.spec.layers, kv.tensors):
            for (name, _), t in zip(layer.tensors, tensors):
                if ids and layer.is_sliding(name) == sliding:
                    t[ids] = POISON

    for pool, sliding in ((eng.core.pool, False), (eng.core.sliding_pool, True)):
        allocate, free = pool.allocate, pool.free

        def poisoned_allocate(n, pool=pool, allocate=allocate, sliding=sliding):
            ids = allocate(n)
            fill(ids, sliding)
            return ids

        def poisoned_free(ids, pool=pool, free=free, sliding=sliding):
            ids = list(ids)
            free(ids)
            fill([b for b in ids if pool.ref_counts[b] == 0 and pool.block_hash[b] is None], sliding)

        pool.allocate, pool.free = poisoned_allocate, poisoned_free


@pytest.mark.parametrize("sabotage", [False, True])
def test_v4_decode_side_hits_read_only_received_rows(monkeypatch, sabotage):
    """deepseek-v4 in P/D: the decode side registers the blocks it received (whole rows, entries, the window's
    sliding blocks) and computed; later handoffs hit them where the last window's sliding blocks the hit covers are
    there (r3 via r2's rows, r4 via r0's window, a follow-up turn via the rows r0 decoded there, M on L's entries
    with no sliding block at all). Every unreceived / freed row is POISON,
    so a read of one turns the tokens into garbage: ``sabotage`` moves one sliding block fewer than the decode side
    registers (its rows stay POISON), and the tokens must differ (the check can fail)."""
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
    params = [greedy, seeded, greedy, seeded, greedy]
    ref = colocated(engine("deepseek-v4"), params)
    follow = prompts()[0] + ref[0] + [3, 4]  # r0's next turn: its prompt, its answer, a new message
    g = torch.Generator().manual_seed(9)
    long = torch.randint(0, 200, (24,), generator=g).tolist()
    other = long[:12] + torch.randint(0, 200, (12,), generator=g).tolist()  # shares long's first three blocks
    colo = engine("deepseek-v4")
    for rid, p in (("f", follow), ("L", long), ("M", other)):
        colo.add_request(rid, p, greedy)
    later = colo.run_to_completion()

    if sabotage:
        real_unpack = unpack_kv

        def lossy_unpack(kv, block_ids, start, stop, buf, sliding_block_ids=None):
            real_unpack(kv, block_ids, start, stop, buf, sliding_block_ids=sliding_block_ids)
            first = _sliding_start(kv, start, stop)  # the first received sliding row: its block stays POISON
            if first < stop:
                fill_sliding = [t for layer, ts in zip(kv.spec.layers, kv.tensors)
                                for (name, _), t in zip(layer.tensors, ts) if layer.is_sliding(name)]
                for t in fill_sliding:
                    t[sliding_block_ids[first // kv.block_size]] = POISON

        monkeypatch.setitem(globals(), "unpack_kv", lossy_unpack)
    pre, dec = engine("deepseek-v4"), engine("deepseek-v4")
    poison(dec)
    moved, toks = disaggregated(pre, dec, params)
    got = [toks[f"r{i}"] for i in range(len(ref))]
    assert moved[3:] == [(8, 8), (12, 15)] and dec.core.pool.prefix_hits == 8 + 12
    if sabotage:
        assert [r[1:] for r in ref] != got
        return
    assert [r[1:] for r in ref] == got
    assert handoff(pre, dec, "f", follow, greedy) == (16, 20)  # r0's rows [0, 16) and its window's [12, 16) hit
    assert handoff(pre, dec, "L", long, greedy) == (0, 24)  # sliding rows [16, 24) only
    # M hits L's whole blocks 0..2 though their window [4, 12) never came: M's steps read sliding rows from 16 on,
    # which arrive (trim_handoff_hit); a computing engine could not hit there (trim_hit)
    assert handoff(pre, dec, "M", other, greedy) == (12, 24)
    toks = decode_all(dec)
    assert [toks[r] for r in "fLM"] == [later[r].token_ids[1:] for r in "fLM"]
    assert dec.core.pool.prefix_hits == 8 + 12 + 16 + 12
    assert dec.core.pool.num_free == dec.core.pool.num_blocks
    assert dec.core.sliding_pool.num_free == dec.core.sliding_pool.num_blocks
