"""MixedGraphRunner: any mixed step (decodes, a prefill chunk over cached context, fresh prompts) through one padded
forward per token bucket == the plain eager forward, in hidden states and in every KV row written; a smaller step
after a larger one (stale padded rows, sequences and block-table columns) changes nothing. Graphs on CUDA only; on CPU
the same padded forward runs eagerly through ``TorchAttention`` (host lists), and on Triton's interpreter through the
graph-padded kernel path (triton_interpreter_checks.py ``mixed_graphs``)."""

from __future__ import annotations

import pytest
import torch
from graph_test_models import MIXED_STEPS, check_mixed_steps, mixed_step, random_caches, tiny_llama  # tests/kernels

from torchinferno.kernels.cuda_graphs_mixed import MixedGraphRunner, supports_mixed_graphs

BS = 4  # block size
NBLK = 64
MAX_BLOCKS = 16  # block-table width of the static buffer (64 tokens)


def check_whole_step_runner(device, dtype, backend, capture: bool) -> MixedGraphRunner:
    """Every MIXED_STEPS step through the runner == the model's own forward on a copy of the caches."""
    model = tiny_llama(device, dtype, backend)
    g = torch.Generator().manual_seed(0)
    caches, ref = random_caches(model, NBLK, BS, dtype, device, g)
    runner = MixedGraphRunner(model, caches, BS, MAX_BLOCKS, buckets=(8, 16, 32))
    assert runner.use_graphs == capture
    runner.capture()
    assert len(runner.graphs) == (3 if capture else 0)
    check_mixed_steps(runner, model, caches, ref, g, device, dtype, BS, NBLK)
    assert (runner.num_replays, runner.num_eager) == ((len(MIXED_STEPS), 0) if capture else (0, len(MIXED_STEPS)))
    return runner


def test_whole_step_padded_forward_equals_eager_forward_cpu():
    runner = check_whole_step_runner("cpu", torch.float32, None, capture=False)
    # after the last step (5 tokens in 2 sequences, bucket 8): the buffers past the live rows hold padding
    assert runner.slot_mapping[5:].eq(-1).all() and runner.input_ids[5:].eq(0).all()
    assert runner.query_start_loc[:9].tolist() == [0, 3, 5, 5, 5, 5, 5, 5, 5]
    assert runner.seq_lens[2:8].eq(0).all()


def test_padding_is_what_keeps_live_rows_apart():
    """Sabotage: a stale slot left by a larger step writes a live cache row, and the comparison sees it."""
    model = tiny_llama("cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    caches, ref = random_caches(model, NBLK, BS, torch.float32, "cpu", g)
    runner = MixedGraphRunner(model, caches, BS, MAX_BLOCKS, buckets=(8, 32))
    big = mixed_step(g, model.config.vocab_size, "cpu", [(0, 20), (10, 1), (2, 9)], BS, NBLK)
    small = mixed_step(g, model.config.vocab_size, "cpu", [(12, 1)], BS, NBLK)
    with torch.inference_mode():
        runner.run(*big)
        model(*big[:2], ref, big[2])
        runner._live = 1  # forget that rows 1..29 hold the big step's slots: they are not reset
        runner.run(*small)
        model(*small[:2], ref, small[2])
    assert any(not torch.equal(t, r) for layer, ref_layer in zip(caches, ref) for t, r in zip(layer, ref_layer))


def test_oversized_step_wide_table_and_buckets():
    model = tiny_llama("cpu", torch.float32)
    spec = model.family.kv_spec(model.config)
    runner = MixedGraphRunner(model, spec.allocate(NBLK, BS, torch.float32, "cpu"), BS, 4, buckets=(8, 16))
    g = torch.Generator().manual_seed(1)
    ids, pos, meta = mixed_step(g, model.config.vocab_size, "cpu", [(0, 17)], BS, NBLK)
    with pytest.raises(ValueError, match="1..16 tokens"):
        runner.run(ids, pos, meta)
    ids, pos, meta = mixed_step(g, model.config.vocab_size, "cpu", [(20, 1)], BS, NBLK)  # 6 table columns
    with pytest.raises(ValueError, match="built for 4"):
        runner.run(ids, pos, meta)
    with pytest.raises(ValueError, match="positive"):
        MixedGraphRunner(model, None, BS, 4, buckets=(0,))


def test_backend_declarations():
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    assert not supports_mixed_graphs(tiny_llama("cpu", torch.float32))  # the torch backend reads host lists
    assert supports_mixed_graphs(tiny_llama("cpu", torch.float32, TritonPagedAttention))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whole_step_graph_replay_matches_eager_cuda(cuda_dev, dtype):
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    check_whole_step_runner(cuda_dev, dtype, TritonPagedAttention, capture=True)


def test_config_and_serve_flag():
    import argparse

    from torchinferno.engine.config import EngineConfig
    from torchinferno.errors import ConfigError
    from torchinferno.server import args as server_args

    with pytest.raises(ConfigError, match="cuda_graph_mixed_mode must be one of piecewise, full, got 'whole'"):
        EngineConfig(cuda_graph_mixed_mode="whole")
    p = argparse.ArgumentParser()
    server_args.add_server_args(p)
    for argv, want in (([], "piecewise"), (["--cuda-graph-mixed-mode", "full"], "full")):
        a = p.parse_args(argv)
        assert server_args.engine_config_from_args(a, 128).cuda_graph_mixed_mode == want
