"""PiecewiseGraphRunner: a mixed step (decodes, a prefill chunk over cached context, a fresh prompt) through graphed
segments around eager attention == the plain eager forward, in hidden states and in every KV row written; a smaller
step after a larger one (stale padded rows) changes nothing; graphs on CUDA only, the same segments eagerly on CPU."""

from __future__ import annotations

import pytest
import torch
from graph_test_models import MIXED_STEPS as STEPS  # tests/kernels (on sys.path under pytest)
from graph_test_models import check_mixed_steps, mixed_step, random_caches, tiny_llama

from torchinferno.kernels.cuda_graphs_piecewise import (
    PiecewiseGraphRunner,
    piecewise_buckets,
    supports_piecewise_graphs,
)

BS = 4  # block size
NBLK = 64


def _step(g, vocab, device, shapes):
    return mixed_step(g, vocab, device, shapes, BS, NBLK)


def _check(device, dtype, backend, capture):
    model = tiny_llama(device, dtype, backend)
    g = torch.Generator().manual_seed(0)
    caches, ref = random_caches(model, NBLK, BS, dtype, device, g)
    runner = PiecewiseGraphRunner(model, caches, BS, buckets=(8, 16, 32))
    assert runner.use_graphs == capture
    runner.capture()
    assert len(runner.segments) == (3 if capture else 0)
    check_mixed_steps(runner, model, caches, ref, g, device, dtype, BS, NBLK)
    assert runner.q is not None and runner.o.shape[0] == 32  # the cut points ran (static buffers exist)
    assert (runner.num_replays, runner.num_eager) == ((len(STEPS), 0) if capture else (0, len(STEPS)))
    for m in runner.attn:  # the cut points are gone after each forward
        assert "forward" not in vars(m)


def test_piecewise_segments_equal_eager_forward_cpu():
    _check("cpu", torch.float32, None, capture=False)


def test_oversized_step_and_buckets():
    model = tiny_llama("cpu", torch.float32)
    spec = model.family.kv_spec(model.config)
    runner = PiecewiseGraphRunner(model, spec.allocate(NBLK, BS, torch.float32, "cpu"), BS, buckets=(8, 16))
    ids, pos, meta = _step(torch.Generator().manual_seed(1), model.config.vocab_size, "cpu", [(0, 17)])
    with pytest.raises(ValueError, match="1..16 tokens"):
        runner.run(ids, pos, meta)
    assert piecewise_buckets(0) == ()
    assert piecewise_buckets(100) == (8, 16, 32, 64, 96, 100)
    assert piecewise_buckets(512)[-1] == 512
    with pytest.raises(ValueError, match="positive"):
        PiecewiseGraphRunner(model, None, BS, buckets=(0,))


def test_backend_declarations():
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    assert not supports_piecewise_graphs(tiny_llama("cpu", torch.float32))  # the torch reference backend: host lists
    assert supports_piecewise_graphs(tiny_llama("cpu", torch.float32, TritonPagedAttention))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_piecewise_graph_replay_matches_eager_cuda(cuda_dev, dtype):
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    _check(cuda_dev, dtype, TritonPagedAttention, capture=True)


def test_config_and_serve_flag():
    import argparse

    from torchinferno.engine.config import EngineConfig
    from torchinferno.errors import ConfigError
    from torchinferno.server import args as server_args

    with pytest.raises(ConfigError, match="cuda_graph_piecewise_tokens must be an integer >= 0"):
        EngineConfig(cuda_graph_piecewise_tokens=-1)
    assert EngineConfig(cuda_graph_piecewise_tokens=0).cuda_graph_piecewise_tokens == 0
    p = argparse.ArgumentParser()
    server_args.add_server_args(p)
    for argv, want in (([], 512), (["--cuda-graph-piecewise-tokens", "0"], 0)):
        a = p.parse_args(argv)
        assert server_args.engine_config_from_args(a, 128).cuda_graph_piecewise_tokens == want
