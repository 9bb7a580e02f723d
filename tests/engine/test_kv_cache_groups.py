"""Hybrid KV cache groups (deepseek-v4): the sliding group's blocks are given back once they slide out of the
window, the whole-sequence group (compressed entries) is kept; engine tokens still equal the full pass (model.generate)
with chunked prefill, prefix hits, preemption and long sequences; other families keep one group."""

import pytest
import torch

from torchinferno.cache.block_pool import BlockPool, hash_token_blocks
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.input_batch import InputBatch
from torchinferno.engine.kv_sizing import hybrid_split, plan_kv_cache, sliding_blocks_needed
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.engine.outputs import ScheduledRequest
from torchinferno.engine.request import Request
from torchinferno.engine.scheduler import Scheduler
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.family import kv_spec, kv_window
from torchinferno.models.deepseek_v4.model import randomize_untrained_
from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

BS = 4


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=7)


def reference(model, prompts, n):
    return [model.generate(torch.tensor(p), max_new_tokens=n, ignore_eos=True)[len(p):].tolist() for p in prompts]


def rand_tokens(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---------------------------------------------------------------------------------------------------- the spec
def test_v4_spec_declares_a_sliding_group_and_other_families_one_group():
    from torchinferno.models.registry import get_family
    from torchinferno.testing import tiny_model

    cfg = tiny_deepseek_v4_config()
    spec = kv_spec(cfg)
    # tiny: sliding_window 6, CSA rate 4 (overlap: 2*4 back), HCA rate 8 -> W = 8
    assert spec.is_hybrid and spec.sliding_window == kv_window(cfg) == 8
    for layer in spec.layers:
        names = [n for n, _ in layer.tensors]
        assert set(layer.whole) == {n for n in names if n in ("centry", "ientry")}
        assert layer.is_sliding("kv") and not any(layer.is_sliding(n) for n in layer.whole)
    dt = torch.float32
    assert (spec.group_bytes_per_token(dt, sliding=True) + spec.group_bytes_per_token(dt, sliding=False)
            == spec.bytes_per_token(dt))
    cache = spec.allocate(5, BS, dt, "cpu", num_sliding_blocks=3)
    for layer, tensors in zip(spec.layers, cache):
        for (name, _), t in zip(layer.tensors, tensors):
            assert t.shape[:2] == ((3 if layer.is_sliding(name) else 5), BS)
    packed = spec.allocate(5, 16, dt, "cpu", num_sliding_blocks=3, pack=True)  # CSA rate 4, HCA rate 8
    rows = {(layer.kind[5:], n): t.shape[1] for layer, ts in zip(spec.layers, packed)
            for (n, _), t in zip(layer.tensors, ts)}
    assert rows[("compressed_sparse_attention", "centry")] == rows[("compressed_sparse_attention", "ientry")] == 4
    assert rows[("heavily_compressed_attention", "centry")] == 2 and rows[("sliding_attention", "kv")] == 16
    llama = tiny_model("llama3")
    lspec = get_family("llama3").kv_spec(llama.config)
    assert not lspec.is_hybrid and lspec.sliding_window == 0
    assert lspec.group_bytes_per_token(dt, sliding=False) == lspec.bytes_per_token(dt)


# ---------------------------------------------------------------------------------------------------- equality
def test_long_sequences_chunked_prefill_and_prefix_hits_equal_the_full_pass(model):
    shared = rand_tokens(22, 3)  # hits of 5 blocks: the window's blocks (8 tokens back) must still be cached
    prompts = [shared + rand_tokens(3, 4), rand_tokens(41, 5), shared + rand_tokens(9, 6), shared[:14],
               shared + rand_tokens(1, 7), rand_tokens(2, 8)]
    ref = reference(model, prompts, 30)
    eng = LLMEngine(model, block_size=BS, max_num_batched_tokens=7, max_num_seqs=3, num_gpu_blocks=200)
    assert eng.core.sliding_pool is not None
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, greedy(30))
    final = eng.run_to_completion()
    assert [final[f"r{i}"].token_ids for i in range(len(prompts))] == ref
    s = eng.stats()
    assert s.prefix_hits > 0 and s.num_sliding_blocks == eng.core.sliding_pool.num_blocks


@pytest.mark.parametrize("bs,async_,blocks", [(1, False, 400), (2, False, 200), (4, False, 100), (6, False, 70),
                                               (8, False, 50), (16, False, 25), (1, True, 400), (4, True, 100),
                                               (4, False, 26), (4, True, 26)])
def test_no_forward_reads_a_given_back_block(model, bs, async_, blocks):
    """Every sliding block given back is filled with NaN (prefix caching off: nothing may legitimately read it
    again): any read behind the window would turn the tokens into garbage. Block size 1 makes the window exact;
    8 and 16 pack the entries at several rows per block (CSA rate 4, HCA 8), 6 leaves them unpacked; async
    scheduling frees while a step is in flight; 26 blocks force preemption (freed blocks poisoned, recomputed)."""
    prompts = [rand_tokens(n, 60 + n) for n in (35, 22, 9)]
    ref = reference(model, prompts, 24)
    eng = LLMEngine(model, block_size=bs, max_num_batched_tokens=5, max_num_seqs=3, num_gpu_blocks=blocks,
                    enable_prefix_caching=False, async_scheduling=async_)
    sp, kv = eng.core.sliding_pool, eng.executor.kv_cache
    free = sp.free

    def poisoned_free(ids):
        ids = list(ids)
        free(ids)
        for layer, tensors in zip(kv.spec.layers, kv.tensors):
            for (name, _), t in zip(layer.tensors, tensors):
                if layer.is_sliding(name):
                    t[[b for b in ids if sp.ref_counts[b] == 0]] = float("nan")

    sp.free = poisoned_free
    for i, p in enumerate(prompts):
        eng.add_request(f"n{i}", p, greedy(24))
    final = eng.run_to_completion()
    assert [final[f"n{i}"].token_ids for i in range(len(prompts))] == ref
    assert (eng.stats().num_preemptions > 0) == (blocks == 26)


def test_prefix_hits_at_every_token_boundary_equal_the_miss(model):
    base = rand_tokens(30, 11)
    eng = LLMEngine(model, block_size=BS, max_num_batched_tokens=64, num_gpu_blocks=200)
    eng.add_request("warm", base, greedy(1))
    eng.run_to_completion()
    assert eng.cached_prefix_tokens(base) == 28  # 7 full blocks, each with its window's sliding blocks cached
    eng.core.sliding_pool._cached.pop(hash_token_blocks(base, BS)[5])  # block 5's sliding copy is gone
    assert eng.cached_prefix_tokens(base) == 20  # hits of 6 or 7 blocks need block 5 in their window
    eng.core.reset_prefix_cache()  # (the pool state above was tampered with)
    eng.add_request("warm2", base, greedy(1))
    eng.run_to_completion()
    prompts = [base[:n] + rand_tokens(2, 100 + n) for n in range(5, 31)]  # hits end inside and at block ends
    ref = reference(model, prompts, 4)
    for i, p in enumerate(prompts):
        eng.add_request(f"h{i}", p, greedy(4))
    final = eng.run_to_completion()
    assert [final[f"h{i}"].token_ids for i in range(len(prompts))] == ref
    assert eng.stats().prefix_hits >= 4 * len(prompts)


def test_preemption_with_few_blocks_equals_the_full_pass(model):
    prompts = [rand_tokens(n, 20 + n) for n in (19, 27, 11, 33)]
    ref = reference(model, prompts, 20)
    eng = LLMEngine(model, block_size=BS, max_num_batched_tokens=16, max_model_len=64, num_gpu_blocks=24)
    for i, p in enumerate(prompts):
        eng.add_request(f"p{i}", p, greedy(20))
        eng.step()
    final = eng.run_to_completion()
    assert [final[f"p{i}"].token_ids for i in range(len(prompts))] == ref
    assert eng.stats().num_preemptions > 0


def test_async_scheduling_equals_the_full_pass(model):
    prompts = [rand_tokens(n, 40 + n) for n in (17, 26, 5)]
    ref = reference(model, prompts, 18)
    eng = LLMEngine(model, block_size=BS, max_num_batched_tokens=8, num_gpu_blocks=64, async_scheduling=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"a{i}", p, greedy(18))
    final = eng.run_to_completion()
    assert [final[f"a{i}"].token_ids for i in range(len(prompts))] == ref


# ---------------------------------------------------------------------------------------------------- blocks freed
def test_sliding_blocks_are_given_back_behind_the_window(model):
    W = kv_window(model.config)
    eng = LLMEngine(model, block_size=BS, max_num_batched_tokens=6, num_gpu_blocks=100)
    sp, pool = eng.core.sliding_pool, eng.core.pool
    prompt = rand_tokens(37, 9)
    eng.add_request("long", prompt, greedy(40))
    bound = -(-W // BS) + 1 + -(-6 // BS) + 1  # the window's blocks + this step's chunk (+ a partial block)
    most = 0
    while eng.has_unfinished():
        eng.step()
        req = eng.core.scheduler.requests.get("long")
        if req is None:
            break
        held = sum(1 for b in req.sliding_block_ids if b >= 0)
        most = max(most, held)
        assert held <= bound
        assert sp.num_blocks - sp.num_free == held  # nothing else holds sliding blocks
        assert len(req.block_ids) == -(-req.num_computed_tokens // BS)  # the whole group keeps every block
        # given back when the step was scheduled: before its context (at most 6 tokens ago) minus W
        assert all(b < 0 for b in req.sliding_block_ids[: max(0, (req.num_computed_tokens - 6 - W) // BS)])
    assert most >= -(-W // BS)  # a window's worth really was held
    assert pool.num_blocks - pool.num_free == 0 and sp.num_blocks - sp.num_free == 0


def test_a_prefix_hit_needs_the_window_blocks_cached():
    """Scheduler only: whole-group blocks cached but the sliding window's evicted -> the hit shrinks to the longest
    prefix whose window is still cached."""
    W = 8
    cfg = EngineConfig(block_size=BS, max_num_batched_tokens=64, max_num_seqs=4)
    pool, sp = BlockPool(64, BS), BlockPool(64, BS)
    sched = Scheduler(cfg, pool, 256, sp, W)
    toks = list(range(100, 130))
    first = Request("a", toks, greedy(1))
    sched.add_request(first)
    sched.schedule()
    first.num_computed_tokens = len(toks)
    sched._register_full_blocks(first)
    hashes = first.block_hashes
    # evict the sliding copy of block 5 (tokens 20..23): hits of 6 or 7 blocks need it, a hit of 5 does not
    sched.finish_request("a", first.status.FINISHED_ABORTED)
    sp._cached.pop(hashes[5])
    req = Request("b", toks + [1, 2], greedy(1))
    sched._ensure_hashes(req, len(req.prompt_token_ids))
    hit, shit, j0 = sched.sliding_hit(req, pool.lookup(req.block_hashes[:7]))
    assert len(hit) == 5 and j0 == (5 * BS - W) // BS and len(shit) == 5 - j0
    sched.add_request(req)
    out = sched.schedule()
    assert out.scheduled[0].num_computed_tokens == 5 * BS
    assert req.sliding_block_ids[:j0] == [-1] * j0 and all(b >= 0 for b in req.sliding_block_ids[j0:])


# ---------------------------------------------------------------------------------------------------- plumbing
def test_input_batch_hybrid_tables():
    ib = InputBatch(BS, "cpu", hybrid=True)
    s = ScheduledRequest("x", [5, 6], 9, [10, 11, 12], [12], True, greedy(1), sliding_block_ids=[-1, 3, 4])
    step = ib.prepare([s])
    meta = step.attention_metadata()
    assert meta.block_tables.tolist() == [[-1, 3, 4]] and meta.whole_block_tables.tolist() == [[10, 11, 12]]
    assert meta.entry_block_tables is meta.whole_block_tables
    assert step.slot_mapping.tolist() == [4 * BS + 1, 4 * BS + 2]  # per-token rows go to the sliding group
    plain = InputBatch(BS, "cpu").prepare([ScheduledRequest("y", [5], 0, [7], [7], True, greedy(1))])
    assert plain.whole_block_tables is None and plain.attention_metadata().whole_block_tables is None


def test_sizing_counts_the_real_per_sequence_need(model):
    spec, dt = kv_spec(model.config), torch.float32
    W, budget = spec.sliding_window, 4 * 2**20
    need = sliding_blocks_needed(W, BS, 8, 64)
    n, s = hybrid_split(spec, dt, BS, budget, need, 1000)
    whole_pb = spec.group_bytes_per_block(dt, BS, sliding=False, pack=True)
    assert s == need and n * whole_pb + s * spec.group_bytes_per_block(dt, BS, sliding=True, pack=True) <= budget
    assert whole_pb < spec.group_bytes_per_token(dt, sliding=False) * BS  # entries packed: one row per window
    single = budget // (spec.bytes_per_token(dt) * BS)
    assert n > 5 * single  # far more tokens fit than with one row of everything per token
    cfg = EngineConfig(block_size=BS, max_num_batched_tokens=64, max_num_seqs=8, kv_cache_memory=budget)
    plan = plan_kv_cache(model, spec, dt, cfg, 128, torch.device("cpu"))
    assert (plan.num_blocks, plan.num_sliding_blocks) == (n, s) and "sliding pool" in plan.reason
    eng = LLMEngine(model, block_size=BS, kv_cache_memory=budget, max_num_seqs=8, max_num_batched_tokens=64)
    assert "sliding-window blocks" in eng.describe()
    assert eng.stats().num_sliding_blocks == s


def test_graph_decode_runner_carries_the_whole_table(model):
    """The CUDA-graph decode runner's static buffers include the whole group's table (run eagerly on CPU, padded
    to a bucket): its logits equal a plain forward with the same two tables."""
    from torchinferno.cache.kv_cache import allocate_kv_cache
    from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    spec = kv_spec(model.config)
    kv = allocate_kv_cache(spec, BS, torch.float32, "cpu", num_blocks=16, num_sliding_blocks=12)
    prompt = rand_tokens(15, 5)
    sliding, whole = [7, 8, 9, 10], [3, 4, 5, 6]
    meta = build_attention_metadata([15], [0], [sliding], BS)
    meta.whole_block_tables = torch.tensor([whole], dtype=torch.int32)
    with torch.inference_mode():
        model(torch.tensor(prompt), torch.arange(15), kv.tensors, meta)
        saved = [tuple(t.clone() for t in layer) for layer in kv.tensors]
        step = build_attention_metadata([1], [15], [sliding], BS)
        ids, pos = torch.tensor([77]), torch.tensor([15])
        step.whole_block_tables = torch.tensor([whole], dtype=torch.int32)
        want = model.compute_logits(model(ids, pos, kv.tensors, step))
        for layer, orig in zip(kv.tensors, saved):
            for t, o in zip(layer, orig):
                t.copy_(o)
        runner = CudaGraphDecodeRunner(model, kv.tensors, BS, 8, batch_sizes=(2,), use_graphs=False, hybrid=True)
        got = runner.run(ids, pos, step.slot_mapping, step.block_tables, step.seq_lens,
                         whole_block_tables=step.whole_block_tables)
    torch.testing.assert_close(got, want)


def test_metrics_report_the_sliding_pool(model):
    from torchinferno.server.metrics import ServerMetrics

    eng = LLMEngine(model, block_size=BS, max_num_batched_tokens=8, num_gpu_blocks=40)
    eng.add_request("m", rand_tokens(20, 2), greedy(3))
    eng.step()
    m = ServerMetrics("v4")
    m.refresh(eng.stats())
    sp = eng.core.sliding_pool
    got = m.registry.get_sample_value("torchinferno_kv_cache_sliding_usage_perc", {"model_name": "v4"})
    assert got == pytest.approx(sp.num_used / sp.num_blocks) and got > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bs", [4, 16])
def test_cuda_graph_engine_with_the_sliding_pool_equals_generate(bs):
    """On CUDA: decode steps replay CUDA graphs (static decode, the Triton sparse-sink kernel and KV append) over
    the two pools and packed entries (block 16: 4 CSA / 2 HCA entry rows per block); tokens equal model.generate
    (same kernels, a dense cache)."""
    torch.manual_seed(0)
    m = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=7).cuda()
    prompts = [rand_tokens(n, 80 + n) for n in (37, 12, 25, 3)]
    ref = reference(m, prompts, 24)
    eng = LLMEngine(m, block_size=bs, max_num_batched_tokens=16, max_num_seqs=4, num_gpu_blocks=512 // bs,
                    enforce_eager=False)
    assert eng.executor.runner.uses_cuda_graphs and eng.core.sliding_pool is not None
    for i, p in enumerate(prompts):
        eng.add_request(f"g{i}", p, greedy(24))
    final = eng.run_to_completion()
    assert [final[f"g{i}"].token_ids for i in range(len(prompts))] == ref
    assert eng.stats().num_graph_steps > 0


def test_prefix_snapshot_of_a_hybrid_cache_restores_a_full_hit(model, tmp_path):
    """save_prefix keeps the whole group's blocks and the last window's sliding blocks; a fresh engine restored from
    it serves the whole prefix from cache and generates the recomputed tokens."""
    from torchinferno.cache.prefix_snapshot import restore_prefix, save_prefix

    prefix = rand_tokens(30, 31)
    prompt = prefix + [5, 6, 7]
    ref = reference(model, [prompt], 8)[0]
    src = LLMEngine(model, block_size=BS, max_num_batched_tokens=64, num_gpu_blocks=64)
    src.add_request("warm", prefix, greedy(1))
    src.run_to_completion()
    snap = save_prefix(src.core, prefix, tmp_path / "v4.safetensors")
    assert (snap.num_tokens, snap.num_blocks) == (28, 7)
    fresh = LLMEngine(model, block_size=BS, max_num_batched_tokens=64, num_gpu_blocks=64)
    assert restore_prefix(fresh.core, snap.path).num_blocks == 7
    assert fresh.cached_prefix_tokens(prompt) == 28
    sp = fresh.core.sliding_pool
    assert sp.num_cached_blocks == -(-kv_window(model.config) // BS)  # only the last window's sliding blocks
    fresh.add_request("r", prompt, greedy(8))
    out = fresh.run_to_completion()["r"]
    assert out.token_ids == ref and fresh.stats().prefix_hits == 28


def test_sequence_bytes_and_plan_parallel_count_the_real_need():
    """``KVSpec.sequence_bytes`` (what one sequence holds in the engine's pool) and plan-parallel's KV line: V4-Flash
    keeps a window of per-token rows and packed entries (> 20x less at 128k tokens); other families are unchanged."""
    from torchinferno.models.deepseek_v4.config import SIZES
    from torchinferno.models.registry import get_family
    from torchinferno.parallel.fake import plan_parallel

    dt, T = torch.bfloat16, 131072
    spec = kv_spec(SIZES["deepseek-v4-flash"]())
    assert 20 * spec.sequence_bytes(dt, T, 64) < T * spec.bytes_per_token(dt)
    llama = get_family("llama3").kv_spec(get_family("llama3").size("debug"))
    assert llama.sequence_bytes(dt, 4096, 16) == 4096 * llama.bytes_per_token(dt)
    plan = plan_parallel("deepseek-v4", "deepseek-v4-flash", 8)
    assert plan.kv_bytes(T) == spec.sequence_bytes(dt, T, 16) < plan.kv_bytes_per_token * T
    assert "sliding window freed" in plan.lines(T)[2]
