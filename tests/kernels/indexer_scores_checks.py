"""Checks of the lightning-indexer scores kernel (kernels/indexer_scores.py), run by tests/kernels/test_indexer_scores.py:
on CPU under ``TRITON_INTERPRET=1`` (``python <this> <check>``), on CUDA as plain functions.

* ``kernel``: the Triton path == ``reference`` (fp32 within 1e-6 relative; fp16 products exact in fp32 too) over odd
  sizes (Q, S, Hi, D off the tiles), several tiles, causal limits (rows seeing nothing, everything, a batch dim);
  the same -inf pattern; the same top-k sets where the k-th score is not near-tied; exact-zero ties keep the earliest
  in both; a query's scores bitwise independent of the query tile / chunk it is computed in; sabotage controls
  (the comparison rejects a reference without the ReLU, with a head dropped, or with limits off by one).
* ``v4``: the tiny V4 v1 prefill (fresh and in 3 chunks) with the indexer kernel == without (logits within 1e-5,
  same argmax); with the kernel, each query's CSA selection in the chunked pass == the full pass.
* ``v4decode``: its static decode (``select_entries``; CUDA: replayed from CUDA graphs), kernel == without.
* ``v32``: the tiny V3.2 model with its indexer scores through ``fused_ops.indexer_scores`` (kernel) == the raw ops,
  over chunked prefill + batched decode.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TOL = 1e-6  # norm-relative, fp32 accumulate (fp16/bf16 inputs: exact products, so the same)


def _counted():
    """Context: counts launches of the Triton wrapper (the kernel path really ran)."""
    from torchinferno.kernels.triton import indexer_scores as kern

    class C:
        def __enter__(self):
            self.real, self.calls = kern.indexer_scores, 0

            def wrapped(*a, **kw):
                self.calls += 1
                return self.real(*a, **kw)

            kern.indexer_scores = wrapped
            return self

        def __exit__(self, *exc):
            kern.indexer_scores = self.real

    return C()


def inputs(device, dtype, Q=37, S=29, Hi=5, D=24, B=None, causal=True, zero_keys=0, seed=0):
    """Random q [(B,) Q, Hi, D], k [(B,) S, D], w [(B,) Q, Hi] fp32, limits [(B,) Q] (some rows see nothing, some
    everything) or None; ``zero_keys`` keys set to 0 (their scores are exactly 0: ties)."""
    g = torch.Generator().manual_seed(seed)
    lead = () if B is None else (B,)
    q = torch.randn(*lead, Q, Hi, D, generator=g)
    k = torch.randn(*lead, S, D, generator=g)
    if zero_keys:
        k[..., torch.randperm(S, generator=g)[:zero_keys], :] = 0.0
    w = torch.randn(*lead, Q, Hi, generator=g)
    lim = None
    if causal:
        lim = torch.randint(0, S + 1, (*lead, Q), generator=g)
        lim[..., 0], lim[..., -1] = 0, S
    cast = lambda t: t.to(dtype).to(device)  # noqa: E731
    return cast(q), cast(k), w.to(device), None if lim is None else lim.to(device)


def compare(got: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> float:
    """Asserts the same -inf pattern and returns the norm-relative error over the finite entries."""
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got)), "-inf pattern differs"
    assert not torch.isnan(got).any()
    a, b = got[fin].double(), ref[fin].double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def topk_idx(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def check_topk(got: torch.Tensor, ref: torch.Tensor, k: int) -> int:
    """Same top-k sets on every row whose k-th and (k+1)-th reference scores are not near-tied -> rows compared."""
    srt = torch.sort(ref, dim=-1, descending=True).values
    gap = (srt[..., k - 1] - srt[..., k]).abs()
    clear = (gap > 1e-5 * srt[..., :1].abs().clamp_min(1e-30)[..., 0]) | ~torch.isfinite(gap)
    a = torch.zeros_like(ref, dtype=torch.bool).scatter_(-1, topk_idx(got, k), True)
    b = torch.zeros_like(ref, dtype=torch.bool).scatter_(-1, topk_idx(ref, k), True)
    assert torch.equal(a[clear], b[clear]), "top-k sets differ on a row without a near-tie"
    return int(clear.sum())


CASES = [
    {},  # odd sizes: Q 37, S 29, Hi 5, D 24; causal
    {"causal": False},
    {"Q": 5, "S": 70, "Hi": 3, "D": 16},  # several key tiles, one query tile
    {"Q": 40, "S": 9, "Hi": 1, "D": 40, "B": 3},  # batch dim (decode's layout), one head
]
SMALL = {"BLOCK_Q": 16, "BLOCK_S": 16, "num_warps": 4, "num_stages": 1}  # several tiles at test sizes


def check_kernel(device, dtype, cases=CASES, configs=(None, SMALL)) -> None:
    from torchinferno.kernels import indexer_scores as iks

    for i, kw in enumerate(cases):
        q, k, w, lim = inputs(device, dtype, seed=i, **kw)
        ref = iks.reference(q, k, w, 0.3, lim)
        for cfg in configs:
            with _counted() as c:
                got = iks.indexer_scores(q, k, w, 0.3, lim, config=cfg)
            assert c.calls == 1, f"{kw}: the kernel did not run"
            assert got.dtype == torch.float32 and got.shape == ref.shape
            err = compare(got, ref)
            assert err <= TOL, f"{kw} {dtype} {cfg}: rel err {err:.2e}"
            check_topk(got.masked_fill(~torch.isfinite(ref), float("-inf")), ref, 3)


def check_ties(device, dtype) -> None:
    """Keys of exactly 0 score exactly 0 on both paths: with more zero keys than the top-k needs past the positive
    scores, both keep the earliest zero keys."""
    from torchinferno.kernels import indexer_scores as iks

    q, k, w, lim = inputs(device, dtype, Q=23, S=40, Hi=4, D=16, zero_keys=25, causal=False, seed=11)
    w = w.abs()  # every score >= 0: the 15 non-zero keys score > 0 (almost surely), the rest exactly 0
    ref = iks.reference(q, k, w, 0.5)
    got = iks.indexer_scores(q, k, w, 0.5, config=SMALL)
    assert int((ref == 0).sum(-1).min()) >= 25 and torch.equal(ref == 0, got == 0)
    for kk in (20, 30):
        sets = [topk_idx(x, kk).sort(-1).values for x in (got, ref)]  # as sets: the positive ones may near-tie
        assert torch.equal(*sets), f"top-{kk} with exact-zero ties differs"


def check_tile_independence(device, dtype) -> None:
    """Scores of queries a..b computed alone (a chunk; keys 0..n-1 only) == rows a..b of the full call, bitwise."""
    from torchinferno.kernels import indexer_scores as iks

    q, k, w, lim = inputs(device, dtype, Q=45, S=50, Hi=3, D=16, seed=5)
    for cfg in (None, SMALL):
        full = iks.indexer_scores(q, k, w, 0.3, lim, config=cfg)
        for a, b, n in ((0, 1, 50), (3, 20, 50), (17, 45, 50), (9, 30, 33)):
            part = iks.indexer_scores(q[a:b], k[:n], w[a:b], 0.3, lim[a:b].clamp(max=n), config=cfg)
            assert torch.equal(part, full[a:b, :n]), f"rows {a}..{b} over {n} keys depend on their tile ({cfg})"
        one = iks.indexer_scores(q[:, None][7:12], k[None].expand(5, -1, -1), w[:, None][7:12], 0.3,
                                 lim[:, None][7:12], config=cfg)[:, 0]
        assert torch.equal(one, full[7:12]), "batched one-row calls (decode) differ from the prefill rows"


def check_sabotage(device, dtype) -> None:
    """Wrong references must fail the comparison the kernel passes: the checks above can fail."""
    from torchinferno.kernels import indexer_scores as iks

    q, k, w, lim = inputs(device, dtype, Q=30, S=40, Hi=4, D=16, seed=3)
    got = iks.indexer_scores(q, k, w, 0.3, lim, config=SMALL)
    ref = iks.reference(q, k, w, 0.3, lim)
    no_relu = (torch.einsum("qhd,sd->qhs", q.float(), k.float()) * 0.3 * w[..., None]).sum(-2)
    no_relu = no_relu.masked_fill(~torch.isfinite(ref), float("-inf"))
    assert compare(got, ref) <= TOL
    drop = w.clone()
    drop[:, -1] = 0
    assert compare(got, no_relu) > 100 * TOL, "sabotage 'ReLU dropped' passed"
    assert compare(got, iks.reference(q, k, drop, 0.3, lim)) > 100 * TOL, "sabotage 'head dropped' passed"
    try:
        compare(got, iks.reference(q, k, w, 0.3, lim + 1))
    except AssertionError:
        pass
    else:
        raise AssertionError("sabotage 'limits + 1' passed")


def check_real_shape(device, dtype, Q: int, S: int, topk: int, rate: int = 1, ctx: int = 0, Hi: int = 64,
                     D: int = 128, seed: int = 0) -> tuple[float, int]:
    """A real indexer shape: Q queries at positions ctx..ctx+Q-1 over S keys, key s visible iff
    s < (pos + 1) // rate (V4 CSA: rate 4, entries; V3.2: rate 1, tokens). Kernel == reference (TOL), the same top-k
    sets where untied, a chunk of the queries alone == its rows of the full call (bitwise) -> (err, rows compared)."""
    from torchinferno.kernels import indexer_scores as iks

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(Q, Hi, D, generator=g).to(dtype).to(device)
    k = torch.randn(S, D, generator=g).to(dtype).to(device)
    w = (torch.randn(Q, Hi, generator=g) * Hi**-0.5).to(device)
    lim = ((ctx + torch.arange(Q) + 1) // rate).clamp(max=S).to(device)
    with _counted() as c:
        got = iks.indexer_scores(q, k, w, D**-0.5, lim)
    assert c.calls == 1
    ref = iks.reference(q, k, w, D**-0.5, lim)
    err = compare(got, ref)
    assert err <= TOL, f"Q={Q} S={S} {dtype}: rel err {err:.2e}"
    rows = check_topk(got, ref, topk)
    del ref
    a, b = Q // 3, Q // 3 + Q // 5
    n = int(lim[b - 1])
    part = iks.indexer_scores(q[a:b], k[:n], w[a:b], D**-0.5, lim[a:b])
    assert torch.equal(part, got[a:b, :n]), "a chunk's scores differ from the full call's rows"
    return err, rows


def _v4_model(device):
    from torchinferno.models.deepseek_v4.compressor import Indexer
    from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
    from torchinferno.models.deepseek_v4.model import V4Attention, randomize_untrained_
    from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

    torch.manual_seed(0)
    model = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=3).to(device)
    for a in model.modules():
        if isinstance(a, V4Attention):
            a.sparse_kernel = device.type == "cuda"  # the interpreter runs only the indexer kernel (speed)
    if device.type == "cpu":  # ... and not the grouped MoE GEMMs nor the cache appends (~80% of its time; their own
        _torch_moe_and_appends()  # interpreter checks: fused_moe_checks.py, test_triton_interpreter.py)
    return model, [m for m in model.modules() if isinstance(m, Indexer)]


def _torch_moe_and_appends() -> None:
    """In this (interpreter) process: the V4 experts and the decode's cache-row appends take their torch paths."""
    from torchinferno.kernels import fused_moe
    from torchinferno.models.common.attention import write_kv
    from torchinferno.models.deepseek_v4 import decode

    fused_moe.usable = lambda x, gate_up: False
    decode.write_rows = lambda cache, rows, slots, has_padding=True: write_kv(cache, rows, slots, has_padding)


def _record_selections(indexers):
    """Wraps each indexer's select: -> (log, undo); log[i] lists layer i's keep-masks in call order."""
    log = [[] for _ in indexers]
    for i, idx in enumerate(indexers):
        real = idx.select

        def select(*a, _real=real, _log=log[i], **kw):
            keep = _real(*a, **kw)
            _log.append(keep)
            return keep

        idx.select = select
    return log, lambda: [idx.__dict__.pop("select", None) for idx in indexers]


def check_v4(device) -> None:
    """Tiny V4 v1 prefill logits with the indexer kernel == without; chunked selections == the full pass's."""
    sys.path[:0] = [str(Path(__file__).resolve().parent)]
    from sparse_sink_prefill_checks import _prefill_logits

    model, indexers = _v4_model(device)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 19, 30)]  # past CSA top-k
    sel = {}
    for chunks in (1, 3):
        got = {}
        for on in (True, False):
            for idx in indexers:
                idx.score_kernel = on
            log, undo = _record_selections(indexers)
            with _counted() as c:
                got[on] = _prefill_logits(model, chunks, prompts)
            undo()
            assert (c.calls > 0) == on, f"kernel {'not ' if on else ''}used (calls {c.calls})"
            if on:
                sel[chunks] = log
        tol = 1e-5 if device.type == "cpu" else 1e-4
        err = float((got[True] - got[False]).norm() / got[False].norm())
        assert err <= tol, f"{chunks} chunk(s): indexer kernel on vs off: rel err {err:.2e}"
        assert torch.equal(got[True].argmax(-1), got[False].argmax(-1))
    # chunked == full: per layer, each sequence's chunk masks (rows of its queries, columns of the entries closed so
    # far) are the full pass's rows, and nothing past those columns was selected there
    for full, parts in zip(sel[1], sel[3]):
        assert len(full) == len(prompts) and len(parts) == 3 * len(prompts)
        for b, keep in enumerate(full):
            r = 0
            for c in range(3):
                kc = parts[c * len(prompts) + b]
                rows = keep[r : r + kc.shape[0]]
                assert torch.equal(rows[:, : kc.shape[1]], kc) and not rows[:, kc.shape[1]:].any(), \
                    f"sequence {b} chunk {c}: selection differs from the full pass"
                r += kc.shape[0]
            assert r == keep.shape[0]


def check_v4_decode(device) -> None:
    """Tiny V4 v1 static decode (decode.py's select_entries, one query row per batch row; CUDA: replayed from CUDA
    graphs) with the indexer kernel == without."""
    model, indexers = _v4_model(device)
    sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "models")]
    import test_deepseek_v4_decode as M

    dec, steps = {}, M.STEPS
    M.STEPS = 6 if device.type == "cpu" else steps  # the interpreter: past the 17-token prompt's next CSA window
    for on in (True, False):
        for idx in indexers:
            idx.score_kernel = on
        with _counted() as c:
            dec[on], _ = M.run(model, static=True, mode="runner" if device.type == "cuda" else "emulated")
        assert (c.calls > 0) == on, f"decode: kernel {'not ' if on else ''}used (calls {c.calls})"
    M.STEPS = steps
    err = float((dec[True] - dec[False]).norm() / dec[False].norm())
    assert err <= (1e-5 if device.type == "cpu" else 1e-4), f"static decode, indexer kernel on vs off: rel err {err:.2e}"
    assert torch.equal(dec[True].argmax(-1), dec[False].argmax(-1))


class _KernelScores:
    """V3.2 ops: the raw (reference) ops with ``indexer_scores`` from the fused ops (the kernel)."""

    def __init__(self):
        from torchinferno.models.deepseek_v32 import fused_ops, raw_ops

        self.raw, self.indexer_scores = raw_ops, fused_ops.indexer_scores

    def __getattr__(self, name):
        return getattr(self.raw, name)


def check_v32(device) -> None:
    """Tiny V3.2 (4 index heads: exact-zero ties happen) with kernel scores == the raw ops, chunked + decode."""
    from dataclasses import replace

    from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
    from torchinferno.models.deepseek_v32.model import DSAIndexer
    from torchinferno.models.registry import get_family
    from torchinferno.testing import randomize_

    fam = get_family("deepseek-v3.2")
    cfg = replace(tiny_deepseek_v32_config(), index_n_heads=4, index_topk=5)
    torch.manual_seed(0)
    m = randomize_(fam.build(cfg, device="cpu", variant="v0").eval(), correction_bias=0.3).to(device)
    g = torch.Generator().manual_seed(7)
    rows = [torch.randint(0, 320, (n,), generator=g).to(device) for n in (14, 11)]
    chunks = [[6, 4, 1, 1, 1, 1], [3, 5, 1, 1, 1]]
    tables = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]

    def run():
        caches = fam.kv_spec(m.config).allocate(10, 4, torch.float32, device)
        done, out = [0, 0], [[], []]
        for step in range(max(len(c) for c in chunks)):
            act = [i for i in range(2) if step < len(chunks[i])]
            qlens, ctx = [chunks[i][step] for i in act], [done[i] for i in act]
            meta = build_attention_metadata(qlens, ctx, [tables[i] for i in act], 4, device=device)
            ids = torch.cat([rows[i][done[i] : done[i] + n] for i, n in zip(act, qlens)])
            with torch.no_grad():
                logits = m.compute_logits(m(ids, positions_for(qlens, ctx).to(device), caches, meta))
            for (i, n), part in zip(zip(act, qlens), logits.split(qlens)):
                out[i].append(part)
                done[i] += n
        return torch.cat([torch.cat(o) for o in out])

    want = run()
    idxs = [x for x in m.modules() if isinstance(x, DSAIndexer)]
    for x in idxs:
        x.ops = _KernelScores()
    with _counted() as c:
        got = run()
    assert c.calls > 0, "the V3.2 indexer did not use the kernel"
    err = float((got - want).norm() / want.norm())
    assert err <= (1e-5 if device.type == "cpu" else 1e-4), f"V3.2 kernel scores vs raw: rel err {err:.2e}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def main() -> None:
    sys.path[:0] = [str(Path(__file__).resolve().parent)]
    from triton_interpreter_checks import run_checks  # the interpreter patches (Triton dispatch accepts CPU tensors)

    def kernel(cpu):
        for dtype in (torch.float32, torch.float16):  # the interpreter has no bf16 (CUDA only)
            check_kernel(cpu, dtype)
            check_ties(cpu, dtype)
            check_tile_independence(cpu, dtype)
        check_sabotage(cpu, torch.float32)

    run_checks({"kernel": kernel, "v4": check_v4, "v4decode": check_v4_decode, "v32": check_v32})


if __name__ == "__main__":
    main()
