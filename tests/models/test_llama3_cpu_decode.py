"""llama3's lean CPU decode step (``models/llama3/cpu_decode.py``) vs the module path it replaces.

The step runs the module path's ops in the same order, so hidden states must be bitwise equal:
for fp32 and bf16 (oneDNN-packed) models, in the static generator's dense-row layout with equal
lengths (its own strided cache views), ragged lengths, rows out of order and paged blocks (the
attention backend's own decode), and through whole greedy generations.
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import StaticGenerator
from torchinferno.kernels.cpu_linear import can_prepack, prepack_linears
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.common.step_model import LeanStepModel, step_model, unwrap
from torchinferno.models.llama3.cpu_decode import CpuDecodeStep
from torchinferno.testing import tiny_model

DTYPES = [torch.float32] + ([torch.bfloat16] if can_prepack(torch.bfloat16) else [])
# (dtype, CPU GEMV kernel): bf16 models are packed for oneDNN (GEMVs padded to MIN_ROWS) and for
# "auto" (our avx512bf16 GEMV where available: no padding)
CONFIGS = [(torch.float32, None)] + [(torch.bfloat16, k) for k in ("onednn", "auto") if torch.bfloat16 in DTYPES]


def _model(dtype: torch.dtype, variant: str = "v1", kernel: str | None = "auto"):
    m = tiny_model("llama3", dtype=dtype, variant=variant)
    if dtype == torch.bfloat16:
        prepack_linears(m, kernel=kernel)
    return m


def _decode_twice(model, rows: list[list[int]], prompt_lens: list[int], block_size: int):
    """Prefill each sequence into its blocks, then one decode step with and without the lean step:
    returns (module-path hidden, lean hidden, module-path caches, lean caches)."""
    g = torch.Generator().manual_seed(3)
    B = len(prompt_lens)
    spec = model.family.kv_spec(model.config)
    caches = spec.allocate(num_blocks=max(max(r) for r in rows) + 1, block_size=block_size, dtype=torch.float32, device="cpu")
    prompt = [torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in prompt_lens]
    step = CpuDecodeStep(model, native=False)  # the Python ops (the native C step: tests/kernels/test_cpu_decode_step.py)
    with torch.inference_mode():
        meta = build_attention_metadata(prompt_lens, [0] * B, rows, block_size)
        model(torch.cat(prompt), torch.cat([torch.arange(n) for n in prompt_lens]), caches, meta)
        ids = torch.randint(0, model.config.vocab_size, (B,), generator=g)
        pos = torch.tensor(prompt_lens)
        outs = []
        for lean in (False, True):
            cache_copy = [tuple(t.clone() for t in layer) for layer in caches]
            meta = build_attention_metadata([1] * B, prompt_lens, rows, block_size)
            meta.block_tables_host = [list(r) for r in rows]
            hidden = step(ids, pos, cache_copy, meta) if lean else model(ids, pos, cache_copy, meta)
            outs.append((hidden, cache_copy))
    return outs[0][0], outs[1][0], outs[0][1], outs[1][1]


@pytest.mark.parametrize("dtype,kernel", CONFIGS)
@pytest.mark.parametrize("rows,prompt_lens,block_size", [
    ([[0]], [7], 32),  # batch 1, dense row: strided views
    ([[1], [2], [3]], [5, 5, 5], 32),  # consecutive rows, equal lengths: strided views
    ([[1], [2], [3]], [3, 9, 6], 32),  # ragged: the backend's masked decode
    ([[3], [0], [2]], [6, 6, 6], 32),  # rows out of order: the backend's gather
    ([[0, 2], [1, 3]], [9, 12], 8),  # paged, two blocks per sequence
])
def test_lean_step_is_bitwise_the_module_path(dtype, kernel, rows, prompt_lens, block_size):
    model = _model(dtype, kernel=kernel)
    want, got, want_caches, got_caches = _decode_twice(model, rows, prompt_lens, block_size)
    assert got is not None and got.dtype == dtype
    assert torch.equal(got, want)
    for a, b in zip(want_caches, got_caches):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_not_a_decode_batch_falls_back():
    model = _model(torch.float32)
    step = CpuDecodeStep(model)
    ids = torch.arange(5)
    assert step(ids, torch.arange(5), None, None) is None
    meta = build_attention_metadata([5], [0], [[0]], 16)  # a prefill
    caches = model.family.kv_spec(model.config).allocate(num_blocks=1, block_size=16, dtype=torch.float32, device="cpu")
    assert step(ids, torch.arange(5), caches, meta) is None


def test_supports_only_the_path_it_reproduces():
    assert CpuDecodeStep.supports(tiny_model("llama3", variant="v1"))
    assert not CpuDecodeStep.supports(tiny_model("llama3", variant="v0"))  # reference ops: other numerics


@pytest.mark.skipif(not can_prepack(torch.bfloat16), reason="oneDNN bf16 not supported on this CPU")
def test_runners_choose_the_step_once_and_generation_is_unchanged():
    """The model's own forward is always the module path; the static generator (like the engine's runner) wraps
    a pre-packed model with its lean step once, and every decode step takes it."""
    model = _model(torch.bfloat16)
    assert not hasattr(model, "decode_step") and not hasattr(model, "enable_cpu_decode_step")
    prompts = [[5, 9, 14, 3], [7, 7, 1, 30], [11, 2, 8, 4]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    gen = StaticGenerator(model, len(prompts), 32)
    assert isinstance(gen.model, LeanStepModel) and isinstance(gen.model.step, CpuDecodeStep)
    calls = []
    step = gen.model.step

    def counting(*args):
        out = step(*args)
        calls.append(out is not None)
        return out

    gen.model.step = counting
    lean = [r.token_ids for r in gen.generate(prompts, params)]
    gen.model = model  # the module path
    ref = [r.token_ids for r in gen.generate(prompts, params)]
    assert lean == ref
    assert len(calls) == 1 + 11 and calls.count(True) == 11  # the prefill falls back; every decode step is lean
    assert step_model(model, "cpu", lean=False) is model
    assert unwrap(gen.model) is model and unwrap(step_model(model, "cpu")) is model


@pytest.mark.slow
@pytest.mark.skipif(not can_prepack(torch.bfloat16), reason="oneDNN bf16 not supported on this CPU")
def test_real_model_bf16_packed_greedy_tokens_unchanged():
    from torchinferno.checkpoint.auto import load_model_auto

    model = load_model_auto("smollm2-135m-instruct", dtype=torch.bfloat16)
    prepack_linears(model)
    g = torch.Generator().manual_seed(0)
    for batch in (1, 3):
        prompts = [torch.randint(10, model.config.vocab_size, (12 + 3 * b,), generator=g).tolist() for b in range(batch)]
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        gen = StaticGenerator(model, batch, 64)
        assert isinstance(gen.model, LeanStepModel)
        gen.model.step = CpuDecodeStep(model, native=False)  # the Python ops (the C step is not bitwise)
        lean = [r.token_ids for r in gen.generate(prompts, params)]
        gen.model = model  # the module path
        ref = [r.token_ids for r in gen.generate(prompts, params)]
        assert lean == ref


@pytest.mark.parametrize("dtype,kernel", CONFIGS)
@pytest.mark.parametrize("native", [False, True])
def test_mixed_step_runs_its_leading_decodes_on_the_step(dtype, kernel, native):
    """A mixed step (decodes, then a fresh prompt and a chunk over cached context) through LeanStepModel: the lean
    step takes the decode rows, the modules the rest (session 30), and hidden states and cache writes match the module
    path on the whole step."""
    model = _model(dtype, kernel=kernel)
    step = CpuDecodeStep(model, native=native)
    if native and step.native is None:
        pytest.skip("no native CPU step for this model / CPU")
    g = torch.Generator().manual_seed(5)
    bs, V = 8, model.config.vocab_size
    kv_dtype = getattr(step, "kv_cache_dtype", None) or torch.float32
    caches = model.family.kv_spec(model.config).allocate(num_blocks=16, block_size=bs, dtype=kv_dtype, device="cpu")
    ctx = [9, 4, 12]  # three sequences with cached context (blocks 0-1, 2, 3-4); the first two decode
    tables = [[0, 1], [2], [3, 4], [5, 6]]
    with torch.inference_mode():
        pre = build_attention_metadata(ctx, [0, 0, 0], tables[:3], bs)
        model(torch.randint(0, V, (sum(ctx),), generator=g), torch.cat([torch.arange(n) for n in ctx]), caches, pre)
        shapes = [(9, 1), (4, 1), (12, 3), (0, 10)]  # (context, new tokens)
        meta = build_attention_metadata([q for _, q in shapes], [c for c, _ in shapes], tables, bs)
        meta.block_tables_host = [list(t) for t in tables]
        ids = torch.randint(0, V, (sum(q for _, q in shapes),), generator=g)
        pos = torch.cat([torch.arange(c, c + q) for c, q in shapes])
        seen = []

        def spy(*args):
            out = step(*args)
            seen.append(None if out is None else out.shape[0])
            return out

        spy.splits_mixed = step.splits_mixed

        copies = [[tuple(t.clone() for t in layer) for layer in caches] for _ in range(2)]
        want = model(ids, pos, copies[0], meta)
        got = LeanStepModel(model, spy)(ids, pos, copies[1], meta)
    assert seen == [None, 2]  # the whole step: not a decode batch; then its two leading decode rows
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 and not native else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    for a, b in zip(copies[0], copies[1]):
        for x, y in zip(a, b):
            torch.testing.assert_close(y.float(), x.float(), **tol)
