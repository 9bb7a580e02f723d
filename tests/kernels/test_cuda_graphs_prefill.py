"""CudaGraphPrefillRunner: a padded bucket's prefill == the unpadded eager prefill, padded rows never write KV, and the
engine takes the graph path only for one fresh prompt (graphs on CUDA only; the padded path on CPU)."""

from __future__ import annotations

import pytest
import torch
from graph_test_models import random_caches, tiny_llama  # tests/kernels (on sys.path under pytest)

from torchinferno.kernels.cuda_graphs_prefill import CudaGraphPrefillRunner, prefill_buckets, supports_prefill_graphs
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.registry import get_family

BS = 4  # block size
NBLK = 40


def _eager_prefill(model, caches, ids, slots, bt):
    T = ids.shape[0]
    dev = ids.device
    meta = AttentionMetadata(torch.tensor([0, T], dtype=torch.int32, device=dev),
                             torch.tensor([T], dtype=torch.int32, device=dev), slots, bt[None].to(torch.int32), BS,
                             [T], [T])
    with torch.inference_mode():
        h = model(ids, torch.arange(T, device=dev), caches, meta)
        return model.compute_logits(h[-1:])


def _check(device, dtype, backend, capture):
    model = tiny_llama(device, dtype, backend)
    g = torch.Generator().manual_seed(0)
    caches, ref = random_caches(model, NBLK, BS, dtype, device, g)
    runner = CudaGraphPrefillRunner(model, caches, BS, buckets=(8, 16, 32))
    assert runner.use_graphs == capture
    runner.capture()
    for n in (20, 5, 16, 1, 9):  # buckets 32, 8, 16, 8, 16: a smaller step after a larger one reuses the buffers
        ids = torch.randint(0, model.config.vocab_size, (n,), generator=g).to(device)
        bt = torch.randperm(NBLK - 1, generator=g)[: -(-n // BS)] + 1  # the prompt's blocks, never block 0
        pos = torch.arange(n)
        slots = (bt[pos // BS] * BS + pos % BS).to(device)
        before = [tuple(t.clone() for t in layer) for layer in caches]
        got = runner.run(ids, slots).clone()
        want = _eager_prefill(model, ref, ids, slots, bt.to(device))
        tol = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got, want, **tol)
        written = torch.zeros(NBLK * BS, dtype=torch.bool, device=device)
        written[slots] = True
        for layer, ref_layer, old in zip(caches, ref, before):
            for t, r, o in zip(layer, ref_layer, old):
                flat, flat_old = t.view(NBLK * BS, -1), o.view(NBLK * BS, -1)
                assert torch.equal(flat[~written], flat_old[~written]), "a padded row wrote KV"
                torch.testing.assert_close(flat[written], r.view(NBLK * BS, -1)[written], **tol)
        assert (runner.slot_mapping[n:] == -1).all()
    assert (runner.num_replays == 5) == capture and (runner.num_eager == 5) != capture


def test_padded_prefill_equals_eager_and_writes_only_live_kv_cpu():
    _check("cpu", torch.float32, None, capture=False)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_graph_replay_matches_eager_cuda(cuda_dev, dtype):
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    _check(cuda_dev, dtype, TritonPagedAttention, capture=True)


def test_buckets_and_backend_declarations():
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    assert prefill_buckets(0) == ()
    assert prefill_buckets(512)[-1] == 512 and prefill_buckets(100) == (16, 32, 64, 96, 100)
    assert not supports_prefill_graphs(tiny_llama("cpu", torch.float32))  # the torch backend reads host lengths
    assert supports_prefill_graphs(tiny_llama("cpu", torch.float32, TritonPagedAttention))
    mla = get_family("deepseek-v3.2")
    assert not supports_prefill_graphs(mla.build(mla.size("debug"), device="meta"))  # MLA: no declaration
    with pytest.raises(ValueError, match="1..8 tokens"):
        CudaGraphPrefillRunner(tiny_llama("cpu", torch.float32), [], BS, buckets=(8,)).run(
            torch.zeros(9, dtype=torch.long), torch.zeros(9, dtype=torch.long))


def test_engine_takes_the_prefill_graph_for_fresh_prompts_only_cpu():
    """An engine whose runner carries the (CPU, padded-eager) prefill runner generates exactly what a plain engine
    does; only the steps that are one fresh prompt go through it (a prefix hit and batched prompts stay eager)."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.llm_engine import LLMEngine

    model = tiny_llama("cpu", torch.float32)
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    shared = list(range(3, 3 + 2 * BS))
    prompts = [[7, 8, 9, 10, 11], shared + [40, 41], shared + [50], [60] * 30]

    def run(graphs: bool):
        cfg = EngineConfig(block_size=BS, num_gpu_blocks=64, max_num_seqs=4, max_model_len=64)
        eng = LLMEngine(model, None, cfg)
        if graphs:
            eng.runner.prefill_graphs = CudaGraphPrefillRunner(eng.runner.model, eng.runner.kv_cache.tensors, BS,
                                                               buckets=(8, 32))
        out = {}
        for i, pr in enumerate(prompts):  # one at a time: each prompt is a step of its own
            eng.add_request(str(i), pr, p)
            out.update({k: o.token_ids for k, o in eng.run_to_completion().items()})
        eng.add_request("a", [1, 2, 3], p)  # two prompts in one step: eager
        eng.add_request("b", [4, 5, 6, 7], p)
        out.update({k: o.token_ids for k, o in eng.run_to_completion().items()})
        return out, eng.runner.num_graph_prefills

    want, none = run(False)
    got, n = run(True)
    assert got == want and none == 0
    assert n == 3  # prompts 0, 1 and 3; prompt 2 hits prompt 1's cached prefix, "a"/"b" share a step


def test_config_rejects_negative_prefill_tokens():
    from torchinferno.engine.config import EngineConfig
    from torchinferno.errors import ConfigError

    with pytest.raises(ConfigError, match="cuda_graph_prefill_tokens"):
        EngineConfig(cuda_graph_prefill_tokens=-1)
