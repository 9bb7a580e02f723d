"""MLA paged decode checks, run by tests/kernels/test_mla_decode.py: on Triton's CPU interpreter (a subprocess with
``TRITON_INTERPRET=1``, CPU tensors, fp32 / fp16) and on CUDA.

``check_kernel``: ``kernels.mla_decode.paged_absorbed_decode`` == ``mla.mla_absorbed_attention`` over the gathered
latent (ragged lengths 1..300, scattered block tables); ``write_latent`` skips slot -1.
``check_head_gemv``: the decode step's W_UK / W_UV head GEMVs == float64 bmm of the same ``kv_b_proj`` slices.
``check_models``: tiny deepseek-v3 (no indexer), dsv4 and deepseek-v3.2 (DSA) models, default (fused) variant vs the
v0 reference with the same weights: prefill into a paged cache then decode steps (paged MLA + fused MoE on the fused
side) through the module path and ``CudaGraphDecodeRunner`` (graphs on CUDA), or on CPU through the runner's bucket
buffers as a capture sees them (placeholder host lengths, ``MLAProjections.capturing`` forced on).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def check_kernel(device, dtype, lens=(1, 5, 64, 300), H=4, dn=16, dv=24, R=64, r=16, bs=16, kernel="mla",
                 fp8_cache=False) -> None:
    from torchinferno.kernels import mla_decode

    saved, mla_decode.DECODE_KERNEL = mla_decode.DECODE_KERNEL, kernel
    try:
        _check_kernel(device, dtype, lens, H, dn, dv, R, r, bs, fp8_cache)
    finally:
        mla_decode.DECODE_KERNEL = saved


def _check_kernel(device, dtype, lens, H, dn, dv, R, r, bs, fp8_cache) -> None:
    from torchinferno.kernels import mla_decode
    from torchinferno.models.common.attention import gather_kv
    from torchinferno.models.common.mla import mla_absorbed_attention

    g = torch.Generator().manual_seed(1)
    B = len(lens)
    per = -(-max(lens) // bs)
    nblocks = B * per + 3
    perm = torch.randperm(nblocks, generator=g)[: B * per].view(B, per).to(torch.int32)  # scattered blocks
    cache = torch.randn(nblocks, bs, R + r, generator=g).to(torch.float8_e4m3fn if fp8_cache else dtype).to(device)
    q_nope = torch.randn(B, H, dn, generator=g).to(dtype).to(device)
    q_pe = torch.randn(B, H, r, generator=g).to(dtype).to(device)
    w = (torch.randn(H * (dn + dv), R, generator=g) * R**-0.5).to(dtype).to(device)
    bt, sl = perm.to(device), torch.tensor(lens, dtype=torch.int32, device=device)
    scale = (dn + r) ** -0.5
    got = mla_decode.paged_absorbed_decode(q_nope, q_pe, cache, w, scale, bt, sl)
    L = max(lens)
    lat = gather_kv(cache, bt, L).float()
    mask = torch.arange(L, device=device)[None, :] < sl[:, None]
    want = mla_absorbed_attention(q_nope.float(), q_pe.float(), lat, w.float(), scale, mask)
    assert got.shape == (B, H, dv) and got.dtype == dtype
    assert _rel(got, want) <= TOL[dtype], f"paged MLA decode {dtype}: rel err {_rel(got, want):.2e}"
    buf = mla_decode.query_buffer(B, H, R, r, dtype, device)  # q_pe placed as the fused prologue places it
    in_buf = buf[:, :, R:].transpose(0, 1)
    in_buf.copy_(q_pe)
    assert mla_decode._query_buffer_of(in_buf, R) is buf and mla_decode._query_buffer_of(q_pe, R) is None
    got_buf = mla_decode.paged_absorbed_decode(q_nope, in_buf, cache, w, scale, bt, sl)
    assert got_buf.is_contiguous() and _rel(got_buf, want) <= TOL[dtype], f"query buffer: {_rel(got_buf, want):.2e}"
    counters = mla_decode.merge_counters(q_nope.device, B)
    assert counters is not None and not counters.any(), "split-merge counters must be left zero"
    if fp8_cache:  # the rows as stored (upcast exactly) are the reference's; write_latent is checked without
        return
    new = torch.randn(3, R + r, generator=g).to(dtype).to(device)
    before = cache.clone()
    mla_decode.write_latent(cache, new, torch.tensor([5, -1, 40], device=device))
    flat, ref = cache.view(-1, R + r), before.view(-1, R + r).clone()
    ref[5], ref[40] = new[0], new[2]
    assert torch.equal(flat, ref), "write_latent: wrong rows written (slot -1 must write nothing)"


def _pair(family: str, size: str, device, dtype, **overrides):
    from dataclasses import replace

    from torchinferno.models.registry import get_family
    from torchinferno.testing import randomize_

    fam = get_family(family)
    cfg = replace(fam.size(size), **overrides)
    models = []
    for variant in ("v1", "v0"):
        torch.manual_seed(0)
        m = randomize_(fam.build(cfg, device="cpu", variant=variant)).to(device=device, dtype=dtype).eval()
        m.family = fam
        models.append(m)
    fused, ref = models
    ref.load_state_dict(fused.state_dict())
    assert fused.ops.NAME == "fused" and ref.ops.NAME == "raw"
    return fused, ref


def _decode_logits(model, device, dtype, ids, mode: str = "module"):
    """Prefill ``P`` tokens per row, then decode the rest one step at a time -> logits [steps, B, V] fp32.

    ``mode``: "module" (model forward), "runner" (``CudaGraphDecodeRunner``: graphs on CUDA, its eager padded path
    on CPU) or "emulated" (CPU: the runner's bucket buffers with the placeholder host lengths a capture sees and
    ``MLAProjections.capturing`` forced on, i.e. what a captured graph computes)."""
    from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner
    from torchinferno.models.common import mla_projections
    from torchinferno.models.common.attention_metadata import (
        build_attention_metadata,
        positions_for,
    )

    bs, B, P = 4, ids.shape[0], 9
    caches = model.family.kv_spec(model.config).allocate(num_blocks=4 * B + 1, block_size=bs, dtype=dtype,
                                                         device=device)
    table = [[1 + 4 * b + j for j in range(4)][::-1] for b in range(B)]  # reversed: non-contiguous
    out = []
    with torch.no_grad():
        meta = build_attention_metadata([P] * B, [0] * B, table, bs, device=device)
        model(ids[:, :P].reshape(-1), positions_for([P] * B, [0] * B).to(device), caches, meta)
        gr = None
        if mode != "module":
            gr = CudaGraphDecodeRunner(model, caches, bs, 4, batch_sizes=(B + 1,))
            if mode == "runner":
                gr.capture()
        for t in range(P, ids.shape[1]):
            meta = build_attention_metadata([1] * B, [t] * B, table, bs, device=device)
            pos = torch.full((B,), t, device=device)
            if mode == "module":
                out.append(model.compute_logits(model(ids[:, t], pos, caches, meta)))
            elif mode == "runner":
                out.append(gr.run(ids[:, t], pos, meta.slot_mapping, meta.block_tables, meta.seq_lens,
                                  meta.seq_lens_list).clone())
            else:
                gr._load(ids[:, t], pos, meta.slot_mapping, meta.block_tables, meta.seq_lens, B + 1)
                real = mla_projections.capturing
                mla_projections.capturing = lambda t: True
                try:
                    out.append(gr._forward(B + 1)[:B].clone())  # host lengths: the placeholder a capture sees
                finally:
                    mla_projections.capturing = real
    return torch.stack(out).float(), gr


def check_prologue(device, dtype, T=5, H=4, dn=16, R=64, r=16, bs=4, fp8_cache: bool = False) -> None:
    """``kernels.triton.mla_prologue`` == the unfused path: RMSNorm of ``c_kv`` (the Triton norm's one-rounding rule,
    ``kernels.reference.ref_rms_norm`` in fp32 then rounded), rope of ``k_pe`` and of each head's ``q_pe``
    (interleaved and halves), the cache rows (``write_kv``; slot -1 writes nothing), from strided ``kv`` / ``q``
    views (columns of a wider projection), into a strided ``q_pe`` destination (the decode query buffer)."""
    from torchinferno.kernels import mla_decode
    from torchinferno.kernels.triton.mla_prologue import mla_prologue
    from torchinferno.models.common.attention import write_kv
    from torchinferno.models.common.rope import apply_rope_interleaved, apply_rope_neox

    g = torch.Generator().manual_seed(4)
    proj = torch.randn(T, R + r + 8, generator=g).to(dtype).to(device)  # kv: a strided column view
    kv = proj[:, 3 : 3 + R + r]
    q = torch.randn(T, H * (dn + r) + 8, generator=g).to(dtype).to(device)[:, : H * (dn + r)].view(T, H, dn + r)
    ang = torch.rand(T, r // 2, generator=g) * 6
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    w = (torch.rand(R, generator=g) + 0.5).to(dtype).to(device)
    slots = torch.tensor(([7, -1, 0, 13, 2] + [4 * bs - 1 - i for i in range(max(T - 5, 0))])[:T], device=device)  # T may exceed 5
    cache_dtype = torch.float8_e4m3fn if fp8_cache else dtype
    for interleaved in (True, False):
        rope = apply_rope_interleaved if interleaved else apply_rope_neox
        c = kv[:, :R].float()
        want_c = (c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(dtype)
        want_lat = torch.cat([want_c, rope(kv[:, None, R:], cos, sin)[:, 0]], -1)
        want_qpe = rope(q[..., dn:], cos, sin)
        cache = torch.zeros(4, bs, R + r, dtype=cache_dtype, device=device)
        want_cache = cache.clone()
        write_kv(want_cache, want_lat, slots, True)
        q_pe = mla_decode.query_buffer(T, H, R, r, dtype, device)[:, :, R:].transpose(0, 1)
        lat = mla_prologue(kv, q, cos, sin, w, 1e-6, r, interleaved, q_pe, cache, slots)
        tol = 0 if dtype == torch.float32 else TOL[dtype]
        for name, got, want in (("latent", lat, want_lat), ("q_pe", q_pe, want_qpe)):
            assert got.dtype == dtype and _rel(got, want) <= max(tol, 1e-6), f"prologue {name} {interleaved}"
        assert _rel(cache.float(), want_cache.float()) <= max(tol, 1e-6) if not fp8_cache else \
            _rel(cache.float(), want_cache.float()) <= 0.07, f"prologue cache {interleaved}"
        assert not cache.view(-1, R + r)[[1, 3, 4, 5, 6, 8]].float().any(), "prologue wrote outside its slots"


MODEL_CASES = [  # family, size, overrides, modes on CPU (CUDA: module + runner with graphs)
    ("deepseek-v3.2", "debug-v3", {}, ("emulated",)),  # paged MLA decode
    ("dsv4", "debug", {}, ("emulated",)),
    ("deepseek-v4", "debug", {}, ("emulated",)),  # static-shape decode + sparse-sink kernel (models/deepseek_v4/decode.py)
    # DSA (capturable through its sparse decode over the top-k latent rows, kernels.mla_decode.sparse_absorbed_decode):
    ("deepseek-v3.2", "debug", {}, ("emulated",)),  # contexts 10-11 past its top-8, sparse selection
    ("deepseek-v3.2", "debug", {"index_topk": 16}, ("emulated",)),  # top-k >= the static width: masked dense
]


def _torch_moe(model) -> None:
    """``model``'s experts (``moe_backend``) and its routers' logits + top-k take their torch paths."""
    from torchinferno.models.common.layers import SigmoidRouter
    from torchinferno.models.common.moe import set_moe_backend

    set_moe_backend(model, "torch")
    for m in model.modules():
        if isinstance(m, SigmoidRouter):
            m._gemv_applies = lambda x: False  # this instance only: no router GEMV / one-launch routing


def check_models(device, dtype=torch.float32) -> None:
    """Fused variants (paged MLA decode or DSA's sparse decode, fused MoE and routing) == the v0 reference with the
    same weights, through the modes of :func:`_decode_logits`."""
    from torchinferno.kernels.cuda_graphs import backend_supports_graphs

    ids = torch.randint(0, 320, (2, 11), generator=torch.Generator().manual_seed(2)).to(device)
    for family, size, overrides, cpu_modes in MODEL_CASES:
        fused, ref = _pair(family, size, device, dtype, **overrides)
        if device.type == "cpu":  # the interpreter: experts and routing by torch (~80% of the check's time; they
            _torch_moe(fused)  # are interpreted in fused_moe_checks.py's model check and moe_routing_checks.py)
        graphs = True  # DSA too: its sparse decode (or, top-k >= the table width, a dense read of <= top-k rows)
        assert backend_supports_graphs(fused) == graphs and not backend_supports_graphs(ref), family
        want, _ = _decode_logits(ref, device, dtype, ids)
        for mode in ("module", "runner") if device.type == "cuda" else cpu_modes:
            got, gr = _decode_logits(fused, device, dtype, ids, mode)
            if mode == "runner":
                assert gr.use_graphs == (graphs and device.type == "cuda"), (gr.use_graphs, device)
            err = _rel(got, want)
            assert err <= TOL[dtype], f"{family} {size} {overrides} {mode}: rel err {err:.2e}"


def check_head_gemv(device, dtype, H=4, dn=8, dv=24, R=40, r=8, configs=({"block_n": 16, "block_k": 16},) * 2,
                    pdl: bool = False) -> None:
    """``kernels.triton.head_gemv`` == float64 ``bmm`` for both MLA absorption products over the slices of one
    ``kv_b_proj`` weight, as the decode step calls them: ``W_UK`` into a query buffer next to the rope dims (which
    must stay as they were), ``W_UV`` from a head-major latent output. ``configs``: the (W_UK, W_UV) tiles; the
    defaults leave a partial tile in both N and K."""
    from torchinferno.kernels.mla_decode import query_buffer
    from torchinferno.kernels.triton.head_gemv import head_gemv
    from torchinferno.models.common.mla import split_kv_b

    g = torch.Generator(device=device).manual_seed(H * R + dn)
    w_kv_b = (torch.randn(H * (dn + dv), R, generator=g, device=device) * R**-0.5).to(dtype)
    w_uk, w_uv = split_kv_b(w_kv_b, H, dn, dv)
    q = torch.randn(1, H, dn + r, generator=g, device=device).to(dtype)  # the q GEMV's output: nope dims, then rope
    buf = query_buffer(1, H, R, r, dtype, device)  # [H, 1, R + r]
    buf[:, :, R:] = 7.0  # the prologue's q_pe: the W_UK product must not touch it
    head_gemv(q[0, :, :dn], w_uk.transpose(1, 2), buf[:, 0, :R], pdl=pdl, config=configs[0])
    want = torch.bmm(q[0, :, :dn].double().unsqueeze(1), w_uk.double()).squeeze(1)  # [H, R]
    assert _rel(buf[:, 0, :R], want) <= TOL[dtype], ("W_UK", _rel(buf[:, 0, :R], want))
    assert bool((buf[:, :, R:] == 7.0).all()), "the W_UK product wrote into the rope dims"
    o_lat = torch.randn(H, 1, R, generator=g, device=device).to(dtype).transpose(0, 1)  # [1, H, R] head-major
    out = head_gemv(o_lat[0], w_uv, torch.empty(H, dv, dtype=dtype, device=device), pdl=pdl, config=configs[1])
    want = torch.bmm(w_uv.double(), o_lat[0].double().unsqueeze(2)).squeeze(2)  # [H, dv]
    assert _rel(out, want) <= TOL[dtype], ("W_UV", _rel(out, want))


@torch.no_grad()  # the absorbed decode's bmm(out=) refuses parameters that require grad
def check_step(device, dtype=torch.float32, pdl: bool = False, steps: int = 5) -> None:
    """deepseek-v3's batch-1 decode-GEMV step (``models/deepseek_v32/cuda_decode.py``) == the module path it replaces
    (fused variant, same weights), with and without the query LoRA, q and kv_a in one launch or two: hidden states
    of ``steps`` greedy decode steps after a 7-token prompt, the latent cache rows the step appended, and its one-row
    head vs the model's linear. The absorption head GEMVs and the MoE's fused norm / residual add are on in the first
    two cases (the MoE layers must take them) and off in the third."""
    from torchinferno.models.deepseek_v32 import cuda_decode

    fused_moe_calls = []

    def counted_moe(*args, **kwargs):  # did the MoE layers take the fused ends (norm in, residual add out)?
        out = real_moe(*args, **kwargs)
        fused_moe_calls.append(out is not None)
        assert kwargs.get("pdl") == pdl, "the MoE's launches follow the step's PDL chain setting"
        return out

    real_moe, cuda_decode.fused_decode_moe = cuda_decode.fused_decode_moe, counted_moe
    try:
        _check_step(device, dtype, pdl, steps, fused_moe_calls)
    finally:
        cuda_decode.fused_decode_moe = real_moe


def _check_step(device, dtype, pdl, steps, fused_moe_calls) -> None:
    from test_cuda_decode_step import _decode_hidden

    from torchinferno.models.common.step_model import LeanStepModel
    from torchinferno.models.deepseek_v32.cuda_decode import MlaCudaDecodeStep
    from torchinferno.testing import tiny_model

    tol = TOL[dtype] * 3  # the step's norms feed the GEMVs in fp32 (the module path rounds them first)
    for size, fuse, absorb in (("debug-v3", True, True), ("debug-v3-no-q-lora", True, True),
                               ("debug-v3-no-q-lora", False, False)):  # the last: every part unfused
        model = tiny_model("deepseek-v3.2", size, variant="v1", device=device).to(dtype)
        spec = model.family.kv_spec(model.config)
        prompt = [5, 17, 99, 3, 42, 7, 8]
        want_caches = spec.allocate(8, 4, dtype, device)
        want = _decode_hidden(model, want_caches, prompt, steps)
        step = MlaCudaDecodeStep(model, pdl=pdl, fuse_q_kv=fuse, absorb_gemv=absorb, fuse_moe_ends=absorb,
                                 pdl_chain=absorb)  # with pdl: every kernel of the fused cases under PDL
        assert step.layers[0].q is None if model.config.q_lora_rank else step.layers[0].q is not None
        assert step.fuse_q_kv == fuse  # q and kv_a in one launch (the tiny configs' q rows divide its tile)
        handled = []

        def counted(*args, step=step, handled=handled):
            out = step(*args)
            handled.append(out is not None)
            return out

        got_caches = spec.allocate(8, 4, dtype, device)
        got = _decode_hidden(LeanStepModel(model, counted), got_caches, prompt, steps)
        assert handled == [False] + [True] * steps, handled  # the prompt by the modules, each decode by the step
        assert fused_moe_calls and all(fused_moe_calls) if absorb else not fused_moe_calls, fused_moe_calls
        fused_moe_calls.clear()
        err = _rel(got, want)
        assert err <= tol, f"{size} fuse_q_kv={fuse} absorb_gemv={absorb}: step vs module path rel err {err:.2e}"
        for g, w in zip(got_caches, want_caches):  # the step's latent appends == the module path's
            assert _rel(g[0], w[0]) <= tol, size
        h = torch.randn(1, model.config.hidden_size, device=device).to(dtype)
        assert step.compute_logits(h) is not None and step.compute_logits(h.expand(2, -1).contiguous()) is None
        ref = torch.nn.functional.linear(h.double(), model.head_weight().double())
        assert _rel(step.compute_logits(h), ref) <= tol


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    import triton_interpreter_checks  # noqa: F401  (interpreter patches; Triton dispatch accepts CPU tensors)

    cpu = torch.device("cpu")
    what = sys.argv[1]
    if what == "kernel":
        check_kernel(cpu, torch.float32)
        check_kernel(cpu, torch.float16)
        check_kernel(cpu, torch.float32, lens=(3, 40), H=20, dn=8, dv=8, R=32, r=8)  # heads over two programs
        check_kernel(cpu, torch.float32, lens=(2, 600, 1100), H=4, dn=8, dv=8, R=32, r=8, bs=64)  # split-K merged
        check_kernel(cpu, torch.float32, lens=(2, 300), H=20, dn=8, dv=8, R=48, r=8)  # R not 2^n, 2 splits merged
        check_kernel(cpu, torch.float32, kernel="gqa")  # the A/B baseline
    elif what == "head_gemv":
        check_head_gemv(cpu, torch.float32)
        check_head_gemv(cpu, torch.float16, H=3, dn=16, dv=8, R=24, configs=({"block_n": 8, "block_k": 8},) * 2)
    elif what == "prologue":
        check_prologue(cpu, torch.float32)
        check_prologue(cpu, torch.float16, T=3, H=20, dn=8, R=32, r=8)  # heads over two blocks of 16
    elif what == "models":
        check_models(cpu)
    elif what == "step":
        from torchinferno.models.deepseek_v32.cuda_decode import MlaCudaDecodeStep

        assert not MlaCudaDecodeStep.supports(_pair("deepseek-v3.2", "debug-v3", cpu, torch.float32)[0])  # CPU weights
        check_step(cpu, steps=3)  # the interpreter runs every kernel on the CPU: 3 decode steps
    print(f"ok {what}")


if __name__ == "__main__":
    main()
