"""CudaGraphDecodeRunner: padded bucket rows never write KV; replay == eager (graphs on CUDA only)."""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner, backend_supports_graphs
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.registry import get_family

BS = 4  # block size
SCRATCH = 0  # block reserved for padded rows


def _model(device, dtype, backend=None):
    from torchinferno.testing import tiny_model

    m = tiny_model("llama3", dtype=dtype, device=device)
    if backend is None:
        return m
    fam = get_family("llama3")
    t = fam.build(m.config, device=device, variant="v1", attention_backend=backend).to(dtype).eval()
    t.load_state_dict(m.state_dict())
    t.family = fam
    return t


def _step_inputs(device, n, gen):
    """n live rows with disjoint block tables (never block 0) and ragged context lengths."""
    lens = torch.randint(2, 4 * BS, (n,), generator=gen)
    perm = torch.randperm(30, generator=gen)[: n * 4] + 1
    bt = perm.view(n, 4).to(torch.int32)
    pos = lens - 1
    slots = bt[torch.arange(n), pos // BS].long() * BS + pos % BS
    ids = torch.randint(0, 250, (n,), generator=gen)
    return [t.to(device) for t in (ids, pos, slots, bt, lens.to(torch.int32))], lens.tolist()


def _eager(model, caches, ids, pos, slots, bt, lens, lens_list):
    n = ids.shape[0]
    meta = AttentionMetadata(torch.arange(n + 1, dtype=torch.int32, device=ids.device), lens, slots, bt, BS,
                             [1] * n, lens_list)
    with torch.inference_mode():
        return model.compute_logits(model(ids, pos, caches, meta))


def _check_runner(device, dtype, backend, capture):
    model = _model(device, dtype, backend)
    spec = model.family.kv_spec(model.config)
    g = torch.Generator().manual_seed(0)
    caches = spec.allocate(32, BS, dtype, device)
    for layer in caches:
        for t in layer:
            t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    ref_caches = [tuple(t.clone() for t in layer) for layer in caches]
    runner = CudaGraphDecodeRunner(model, caches, BS, max_blocks_per_seq=6, batch_sizes=(1, 2, 4, 8),
                                   scratch_block=SCRATCH)
    assert runner.use_graphs == capture
    runner.capture()
    for n in (3, 1, 5, 3):  # padded buckets 4, 1, 8, 4; replays with new inputs
        (ids, pos, slots, bt, lens), lens_list = _step_inputs(device, n, g)
        before = [tuple(t.clone() for t in layer) for layer in caches]
        got = runner.run(ids, pos, slots, bt, lens, lens_list).clone()
        want = _eager(model, ref_caches, ids, pos, slots, bt, lens, lens_list)
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got, want, **tol)
        written = torch.zeros(32 * BS, dtype=torch.bool)
        written[slots.cpu()] = True
        for layer, ref_layer, old in zip(caches, ref_caches, before):
            for t, r, o in zip(layer, ref_layer, old):
                flat, flat_old = t.view(32 * BS, -1), o.view(32 * BS, -1)
                assert torch.equal(flat[~written.to(device)], flat_old[~written.to(device)]), "a padded row wrote KV"
                torch.testing.assert_close(flat[written.to(device)], r.view(32 * BS, -1)[written.to(device)], **tol)
    assert (runner.num_replays > 0) == capture


def test_padded_rows_never_write_kv_cpu():
    _check_runner("cpu", torch.float32, None, capture=False)


def test_torch_backend_is_not_capturable():
    assert not backend_supports_graphs(_model("cpu", torch.float32))


def test_oversized_batch_runs_eagerly_cpu():
    model = _model("cpu", torch.float32)
    caches = model.family.kv_spec(model.config).allocate(32, BS, torch.float32, "cpu")
    runner = CudaGraphDecodeRunner(model, caches, BS, 6, batch_sizes=(1, 2))
    (ids, pos, slots, bt, lens), lens_list = _step_inputs("cpu", 3, torch.Generator().manual_seed(1))
    out = runner.run(ids, pos, slots, bt, lens, lens_list)
    assert out.shape == (3, model.config.vocab_size) and runner.num_eager == 1


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_matches_eager_cuda(cuda_dev, dtype):
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    _check_runner(cuda_dev, dtype, TritonPagedAttention, capture=True)


def test_rows_of_a_larger_step_are_padding_again_cpu():
    """Rows a larger step filled are reset when a smaller step reuses the buffers (and only then)."""
    model = _model("cpu", torch.float32)
    caches = model.family.kv_spec(model.config).allocate(32, BS, torch.float32, "cpu")
    runner = CudaGraphDecodeRunner(model, caches, BS, 6, batch_sizes=(4, 8))
    g = torch.Generator().manual_seed(2)
    for n in (5, 3, 3, 1):
        (ids, pos, slots, bt, lens), lens_list = _step_inputs("cpu", n, g)
        runner.run(ids, pos, slots, bt, lens, lens_list)
        assert torch.equal(runner.slot_mapping[:n], slots)
        assert (runner.slot_mapping[n:] == -1).all() and (runner.seq_lens[n:] == 1).all()
        assert (runner.block_tables[n:] == runner.scratch_block).all() and (runner.input_ids[n:] == 0).all()
