"""Runner choice (eager on CPU, CUDA graphs on CUDA unless ``enforce_eager``), the persistent input
batch against the metadata reference, and (CUDA only) graph-replayed engine outputs == eager."""

from __future__ import annotations

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine import graph_runner
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.input_batch import InputBatch
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.engine.model_runner import ModelRunner
from torchinferno.engine.outputs import ScheduledRequest
from torchinferno.kernels import triton as tri
from torchinferno.kernels.cuda_graphs import backend_supports_graphs
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.registry import get_family

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


# ------------------------------------------------------------------------------ runner choice
def test_cpu_engine_runs_the_eager_runner(tiny_llama):
    eng = LLMEngine(tiny_llama)
    assert type(eng.runner) is ModelRunner and not eng.runner.uses_cuda_graphs
    assert "runner=eager" in eng.describe()
    eng.add_request("a", [5, 6, 7], GREEDY)
    eng.run_to_completion()
    assert eng.stats().num_graph_steps == 0 and eng.stats().num_forward_calls == 6


class _FakeGraphRunner(ModelRunner):
    def __init__(self, model, kv_cache, max_num_seqs, max_model_len, prefill_tokens=0, piecewise_tokens=0,
                 mixed_mode="piecewise"):
        super().__init__(model, kv_cache, max_num_seqs, max_model_len)
        self.max_num_seqs, self.prefill_tokens, self.piecewise_tokens = max_num_seqs, prefill_tokens, piecewise_tokens
        self.mixed_mode = mixed_mode


def test_engine_picks_graphs_when_capturable_unless_enforce_eager(tiny_llama, monkeypatch):
    monkeypatch.setattr(graph_runner, "can_use_cuda_graphs", lambda model, kv: True)
    monkeypatch.setattr(graph_runner, "CudaGraphModelRunner", _FakeGraphRunner)
    eng = LLMEngine(tiny_llama, max_num_seqs=12)
    assert type(eng.runner) is _FakeGraphRunner and eng.runner.max_num_seqs == 12
    assert eng.runner.prefill_tokens == EngineConfig().cuda_graph_prefill_tokens == 512  # the config reaches it
    assert eng.runner.piecewise_tokens == EngineConfig().cuda_graph_piecewise_tokens == 512
    assert eng.runner.mixed_mode == "piecewise"
    full = LLMEngine(tiny_llama, None, EngineConfig(max_num_seqs=12, cuda_graph_mixed_mode="full"))
    assert full.runner.mixed_mode == "full"
    eager = LLMEngine(tiny_llama, None, EngineConfig(max_num_seqs=12, enforce_eager=True))
    assert type(eager.runner) is ModelRunner


def test_graph_batch_sizes_end_at_max_num_seqs():
    assert graph_runner.graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_runner.graph_batch_sizes(6) == [1, 2, 4, 6]
    assert graph_runner.graph_batch_sizes(1) == [1]
    assert graph_runner.graph_batch_sizes(300)[-3:] == [192, 256, 300]
    big = graph_runner.graph_batch_sizes(10_000)
    assert big[-1] == graph_runner.MAX_GRAPH_BATCH and big[-3:] == [384, 448, 512]


def test_deepseek_models_are_captured_only_on_the_paged_mla_path():
    """MLA models declare ``supports_cuda_graphs`` when decode reads only device tensors and bounded rows: the fused
    variant's paged MLA decode (kernels.mla_decode) or, with a DSA indexer (V3.2), its sparse decode over the top-k
    rows (not the dense keep-mask path, ``sparse_decode = False``), never v0."""
    from torchinferno.models.deepseek_v32.model import DeepSeekMLA
    from torchinferno.testing import tiny_model

    dsa = tiny_model("deepseek-v3.2")
    assert backend_supports_graphs(dsa)  # DSA indexer: sparse decode
    for m in dsa.modules():
        if isinstance(m, DeepSeekMLA):
            m.sparse_decode = False
    assert not backend_supports_graphs(dsa)  # the dense keep-mask decode reads the whole table width
    assert not backend_supports_graphs(tiny_model("deepseek-v3.2", variant="v0"))
    for name, size in (("deepseek-v3.2", "debug-v3"), ("dsv4", "debug")):
        assert backend_supports_graphs(tiny_model(name, size=size))
        assert not backend_supports_graphs(tiny_model(name, size=size, variant="v0"))  # the reference ops


def test_default_attention_backend_is_triton_for_gqa_families_on_cuda(monkeypatch):
    from torchinferno.checkpoint.auto import default_attention_backend
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    llama = get_family("llama3")
    assert default_attention_backend(llama, llama.size("debug"), "cpu") is None
    monkeypatch.setattr(tri, "available", lambda: True)
    assert default_attention_backend(llama, llama.size("debug"), "cuda:0") is TritonPagedAttention
    assert default_attention_backend(llama, llama.size("debug"), "cpu") is None
    for name in ("deepseek-v3.2", "dsv4"):
        fam = get_family(name)
        assert default_attention_backend(fam, fam.size("debug"), "cuda") is None


def test_serve_smoke_accepts_enforce_eager(capsys):
    from torchinferno.cli.main import main

    assert main(["serve-smoke", "--num-requests", "3", "--max-tokens", "4", "--enforce-eager"]) == 0
    assert "OK: 3/3" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_graph_runner_step_logic_equals_eager_on_cpu(tiny_llama, monkeypatch, mode):
    """Without CUDA the decode runner executes its padded bucket buffers eagerly: the replay
    decision, the input batch and the padding (slot -1, scratch rows) still have to give the
    eager runner's tokens. So do the mixed steps' piecewise segments or whole-step padded buffers."""
    from torchinferno.kernels.cuda_graphs_mixed import MixedGraphRunner

    monkeypatch.setattr(graph_runner, "can_use_cuda_graphs", lambda model, kv: True)
    monkeypatch.setattr(graph_runner, "supports_piecewise_graphs", lambda model: True)
    monkeypatch.setattr(graph_runner, "supports_mixed_graphs", lambda model: True)
    prompts, params = _ragged_requests(11)
    kw = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "block_size": 4, "max_model_len": 64}
    padded = LLMEngine(tiny_llama, None, EngineConfig(**kw, cuda_graph_piecewise_tokens=32, cuda_graph_mixed_mode=mode))
    assert isinstance(padded.runner, graph_runner.CudaGraphModelRunner) and padded.runner.batch_sizes == [1, 2, 4]
    assert padded.runner.piecewise.buckets == [8, 16, 32]
    assert isinstance(padded.runner.piecewise, MixedGraphRunner) == (mode == "full")
    assert padded.runner.mixed_graph_mode == mode
    assert ("whole-step mixed graphs" in padded.describe()) == (mode == "full")
    got = _engine_outputs(padded, prompts, params, stagger=True)
    want = _engine_outputs(LLMEngine(tiny_llama, None, EngineConfig(**kw, enforce_eager=True)), prompts, params, True)
    assert got == want
    s = padded.stats()
    assert 0 < s.num_graph_steps < s.num_forward_calls
    assert padded.runner.graph.num_eager == s.num_graph_steps  # CPU: the bucket buffers ran eagerly
    # the other steps of <= 32 tokens went through the piecewise segments (eagerly on CPU), longer ones not
    pw = padded.runner.piecewise
    assert 0 < pw.num_eager == padded.runner.num_piecewise_steps < s.num_forward_calls - s.num_graph_steps
    assert padded.pool.num_used == 0


@pytest.mark.parametrize("family,size", [("deepseek-v3.2", "debug-v3"), ("dsv4", "debug"), ("deepseek-v3.2", "debug")])
def test_graph_runner_padded_buckets_equal_eager_for_mla_models(family, size, monkeypatch):
    """MLA models through the padded bucket buffers (slot -1 rows, scratch block tables) on CPU: same tokens as the
    eager runner (the torch latent write skips the padded rows)."""
    from torchinferno.testing import tiny_model

    model = tiny_model(family, size=size)
    monkeypatch.setattr(graph_runner, "can_use_cuda_graphs", lambda model, kv: True)
    prompts, params = _ragged_requests(5)
    kw = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "block_size": 4, "max_model_len": 64}
    padded = LLMEngine(model, None, EngineConfig(**kw))
    got = _engine_outputs(padded, prompts, params, stagger=True)
    want = _engine_outputs(LLMEngine(model, None, EngineConfig(**kw, enforce_eager=True)), prompts, params, True)
    assert got == want and padded.stats().num_graph_steps > 0


# ------------------------------------------------------------------------------ input batch
def _sched(rid, tokens, computed, blocks, new, sample=True):
    return ScheduledRequest(rid, tokens, computed, list(blocks), list(new), sample, GREEDY)


def _check_step(batch: InputBatch, reqs, bs):
    step = batch.prepare(reqs)
    q = [len(s.token_ids) for s in reqs]
    c = [s.num_computed_tokens for s in reqs]
    tables = [s.block_ids[: -(-(ci + qi) // bs)] for s, ci, qi in zip(reqs, c, q)]
    ref = build_attention_metadata(q, c, tables, bs)
    meta = step.attention_metadata()
    assert torch.equal(meta.query_start_loc, ref.query_start_loc)
    assert torch.equal(meta.seq_lens, ref.seq_lens)
    assert torch.equal(meta.slot_mapping, ref.slot_mapping)
    assert meta.block_tables.dtype == torch.int32 and meta.block_tables.shape == ref.block_tables.shape
    for i, row in enumerate(tables):  # columns past a row's blocks are never read
        assert meta.block_tables[i, : len(row)].tolist() == row
    assert meta.seq_lens_list == ref.seq_lens_list and meta.query_lens_list == q
    assert step.input_ids.tolist() == [t for s in reqs for t in s.token_ids]
    want_pos = [p for ci, qi in zip(c, q) for p in range(ci, ci + qi)]
    assert step.positions.tolist() == want_pos
    rows = [i for i, s in enumerate(reqs) if s.sample]
    assert step.sample_rows == rows
    assert step.sample_indices.tolist() == [ref.query_start_loc[i + 1].item() - 1 for i in rows]


def test_input_batch_matches_the_metadata_reference_across_steps():
    bs = 4
    batch = InputBatch(bs, "cpu", max_rows=2, max_blocks=2)  # both grow on demand
    # Step 1: a prefill with a prefix hit (block 9 cached, block 3 new) and a fresh prompt.
    _check_step(batch, [_sched("a", [1, 2, 3], 4, [9, 3], [3]), _sched("b", [4, 5, 6, 7, 8], 0, [5, 6], [5, 6])], bs)
    # Step 2: decodes; "a" crosses into a new block, "b" does not; a third request joins (rows grow).
    _check_step(batch, [_sched("a", [11], 7, [9, 3], []), _sched("b", [12], 5, [5, 6], []),
                        _sched("c", [1, 2], 0, [7], [7])], bs)
    _check_step(batch, [_sched("a", [13], 8, [9, 3, 8], [8]), _sched("b", [14], 6, [5, 6], []),
                        _sched("c", [3, 4, 5, 6, 7, 8, 9, 10, 11], 2, [7, 1, 2], [1, 2], sample=False)], bs)
    # "b" finishes, "a" is preempted and re-admitted with other blocks: rows are released and rewritten.
    batch.release(["b", "a"])
    assert batch.num_live_rows == 1
    _check_step(batch, [_sched("c", [12], 11, [7, 1, 2], []), _sched("a", list(range(1, 10)), 0, [4, 0, 10], [4, 0, 10])],
                bs)
    _check_step(batch, [_sched("c", [13], 12, [7, 1, 2, 11], [11]), _sched("a", [20], 9, [4, 0, 10], [])], bs)
    # A row whose written prefix disagrees with the step (a re-admission whose release was not seen)
    # is rewritten whole.
    _check_step(batch, [_sched("a", [21, 22], 4, [13, 14], [14])], bs)


# ------------------------------------------------------------------------------ CUDA
def _ragged_requests(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 250, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    # Different lengths so the batch shrinks through several buckets (padded rows every step).
    params = [SamplingParams(max_tokens=4 + (i * 5) % 17, temperature=0.0, ignore_eos=True) for i in range(n)]
    params[3] = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, logprobs=2)  # forces eager steps
    return prompts, params


def _engine_outputs(engine: LLMEngine, prompts, params, stagger: bool):
    final = {}
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", p, sp)
        if stagger:
            final.update({o.request_id: o for o in engine.step() if o.finished})
    final.update(engine.run_to_completion())
    return [final[f"r{i}"].token_ids for i in range(len(prompts))]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("stagger,mode", [(False, "piecewise"), (True, "piecewise"), (True, "full")])
def test_graph_engine_equals_enforce_eager_cuda(cuda_tiny_llama, stagger, mode):
    model = cuda_tiny_llama
    prompts, params = _ragged_requests(19)
    kw = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 4, "max_model_len": 64}
    graphs = LLMEngine(model, None, EngineConfig(**kw, cuda_graph_mixed_mode=mode))
    assert graphs.runner.mixed_graph_mode == mode  # the whole-step capture worked (no fallback)
    assert isinstance(graphs.runner, graph_runner.CudaGraphModelRunner)
    assert graphs.runner.batch_sizes == [1, 2, 4, 8] and "runner=cuda-graphs" in graphs.describe()
    eager = LLMEngine(model, None, EngineConfig(**kw, enforce_eager=True))
    assert type(eager.runner) is ModelRunner
    got = _engine_outputs(graphs, prompts, params, stagger)
    want = _engine_outputs(eager, prompts, params, stagger)
    assert got == want
    s = graphs.stats()
    assert 0 < s.num_graph_steps < s.num_forward_calls  # replays, plus eager prefill / logprob steps
    assert eager.stats().num_graph_steps == 0
    pw = graphs.runner.piecewise  # mixed / multi-prompt steps of <= 64 tokens: segments around attention, or whole
    assert pw is not None and pw.buckets[-1] == 64 and 0 < pw.num_replays == graphs.runner.num_piecewise_steps
    assert graphs.pool.num_used == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family,size", [("deepseek-v3.2", "debug-v3"), ("dsv4", "debug")])
def test_graph_engine_equals_enforce_eager_cuda_mla_moe(family, size):
    """DeepSeek-style models (fused MoE + paged MLA / DSA decode) replay decode steps from CUDA graphs: same greedy
    tokens as the eager runner."""
    from torchinferno.testing import tiny_model

    model = tiny_model(family, size=size, device="cuda")
    prompts, params = _ragged_requests(9)
    kw = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 4, "max_model_len": 64}
    graphs = LLMEngine(model, None, EngineConfig(**kw))
    assert isinstance(graphs.runner, graph_runner.CudaGraphModelRunner)
    got = _engine_outputs(graphs, prompts, params, True)
    want = _engine_outputs(LLMEngine(model, None, EngineConfig(**kw, enforce_eager=True)), prompts, params, True)
    assert got == want and graphs.stats().num_graph_steps > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_load_model_auto_builds_triton_attention_on_cuda(tmp_path):
    from torchinferno.checkpoint.auto import load_model_auto, save_pretrained
    from torchinferno.testing import tiny_model

    if not tri.available():
        pytest.skip("needs Triton")
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    save_pretrained(tiny_model("llama3"), tmp_path)
    model = load_model_auto(tmp_path, device="cuda")
    assert any(isinstance(m, TritonPagedAttention) for m in model.modules())
    assert backend_supports_graphs(model)
    assert not backend_supports_graphs(load_model_auto(tmp_path, device="cpu"))
