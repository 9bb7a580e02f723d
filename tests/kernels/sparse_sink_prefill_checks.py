"""Checks of DeepSeek-V4's prefill attention (kernels/sparse_sink_prefill.py: the decode kernel, one row per query),
run by tests/kernels/test_sparse_sink_prefill.py: on CPU under ``TRITON_INTERPRET=1`` (``python <this> <check>``),
on CUDA as plain functions.

* ``kernel``: the Triton path == ``reference`` (``V4Attention._attend``'s arithmetic) for sliding-only, HCA
  (every closed window visible) and CSA (a top-k selection among them) layers; fresh prompts and chunks over a
  cached context (``ctx > 0``, keys from ``lo``), prompts not multiples of the rates, windows crossing tile and
  head-block edges, queries with no visible entry, split-K; plus sabotage controls (the sink dropped, the window
  one longer, the CSA selection ignored: each must fail the same tolerance).
* ``model``: the tiny V4 v1 model's prefill logits, fresh and chunked (3 chunks: the first fresh, the rest over a
  cached context) through the paged cache, with the kernel == with ``sparse_kernel`` off (the torch ``_attend``
  path); fp32 equal to summation order, low precision no further from the fp32 model than the torch path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def inputs(device, dtype, Q=19, ctx=0, H=4, D=32, W=6, kind="sliding", rate=4, topk=3, seed=0):
    """Random q / keys / entries / visibility of one sequence: Q queries at positions ctx..ctx+Q-1; keys from
    ``lo = max(0, ctx - W + 1)`` (what the model reads); HCA: every closed window visible; CSA: the top-``topk``
    of random scores among them (ties broken as ``Indexer.select``)."""
    from torchinferno.models.deepseek_v4.compressor import visible_entries

    g = torch.Generator().manual_seed(seed)
    S = ctx + Q
    lo = max(0, ctx - W + 1)
    q = torch.randn(Q, H, D, generator=g).to(dtype).to(device)
    keys = torch.randn(S - lo, D, generator=g).to(dtype).to(device)
    sinks = (torch.randn(H, generator=g) + 1.0).to(device)  # large enough that dropping it shows
    pos = torch.arange(ctx, S, device=device)
    ent = vis = None
    width = None
    if kind != "sliding":
        n = S // rate
        ent = torch.randn(n, D, generator=g).to(dtype).to(device)
        vis = visible_entries(pos, n, rate)
        if kind == "csa" and topk < n:
            scores = torch.randn(Q, n, generator=g).to(device).masked_fill(~vis, float("-inf"))
            idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :topk]
            vis = torch.zeros_like(vis).scatter_(1, idx, True) & vis
        width = min(topk, n) if kind == "csa" else None
    return dict(q=q, pos=pos, keys=keys, lo=lo, ent=ent, vis=vis, sinks=sinks, scale=D**-0.5, window=W), width


def run_case(device, dtype, config=None, **kw):
    """-> (kernel out, torch path in dtype, fp32 oracle, inputs, width)."""
    from torchinferno.kernels import sparse_sink_prefill as spp

    a, width = inputs(device, dtype, **kw)
    got = spp.sparse_sink_prefill(**a, use_triton=True, width=width, config=config)
    torch_path = spp.reference(**a)
    f32 = {**a, "q": a["q"].float(), "keys": a["keys"].float(),
           "ent": None if a["ent"] is None else a["ent"].float()}
    return got, torch_path, spp.reference(**f32), a, width


CASES = [
    {"kind": "sliding", "Q": 19},  # fresh prompt over several window lengths
    {"kind": "sliding", "Q": 7, "ctx": 11},  # chunk: keys from lo = ctx - W + 1
    {"kind": "hca", "Q": 27, "rate": 8},  # not a multiple of the rate; early queries see no entry
    {"kind": "hca", "Q": 5, "ctx": 17, "rate": 8},
    {"kind": "csa", "Q": 23, "topk": 3},  # the selection bites from position 15 on
    {"kind": "csa", "Q": 10, "ctx": 13, "topk": 3},
    {"kind": "csa", "Q": 6, "ctx": 3, "topk": 8},  # top-k wider than the entries: all visible ones
    # two head blocks, hd not a power of two, a window over several row tiles, CSA width over a tile
    {"kind": "csa", "Q": 50, "ctx": 30, "H": 20, "D": 48, "W": 40, "topk": 5},
    {"kind": "hca", "Q": 1, "ctx": 40, "W": 9, "rate": 8},  # one query (an eager decode step)
    {"kind": "sliding", "Q": 4, "W": 64},  # window longer than the sequence
    {"kind": "csa", "Q": 12, "ctx": 20, "topk": 4, "config": {"SPLITS": 3, "BLOCK_N": 16}},  # split-K merge
]


class _Counted:
    """Counts launches of the decode kernel's wrapper while active (the Triton path really ran)."""

    def __enter__(self):
        from torchinferno.kernels.triton import sparse_sink_decode as k

        self.k, self.real, self.calls = k, k.sparse_sink_decode, []
        k.sparse_sink_decode = lambda *a, **kw: self.calls.append(kw.get("round_logits")) or self.real(*a, **kw)
        return self

    def __exit__(self, *exc):
        self.k.sparse_sink_decode = self.real


def check_kernel(device, dtype, cases=CASES) -> None:
    tol = TOL[dtype]
    for i, kw in enumerate(cases):
        with _Counted() as c:
            got, torch_path, exact, _, _ = run_case(device, dtype, seed=i, **kw)
        assert c.calls == [True], f"case {kw}: the Triton path did not run once ({c.calls})"
        assert got.dtype == dtype and got.shape == exact.shape
        err, err_torch = _rel(got, exact), _rel(got, torch_path)
        assert err <= tol and err_torch <= tol, f"case {kw} {dtype}: rel err {err:.2e} (vs torch {err_torch:.2e}) > {tol}"


def check_sabotage(device, dtype) -> None:
    """Each wrong variant must miss the tolerance the real one meets: the checks above can fail."""
    from torchinferno.kernels import sparse_sink_prefill as spp
    from torchinferno.models.deepseek_v4.compressor import visible_entries

    tol = TOL[dtype]
    a, width = inputs(device, dtype, kind="csa", Q=23, ctx=5, topk=3, seed=7)
    want = spp.reference(**a)
    assert _rel(spp.sparse_sink_prefill(**a, width=width), want) <= tol
    wrong = {
        "sink dropped": ({**a, "sinks": torch.full_like(a["sinks"], -1e4)}, width),
        "window + 1": ({**a, "window": a["window"] + 1}, width),
        "selection ignored": ({**a, "vis": visible_entries(a["pos"], a["vis"].shape[1], 4)}, None),
    }
    for name, (b, w) in wrong.items():
        err = _rel(spp.sparse_sink_prefill(**b, width=w), want)
        assert err > 3 * tol, f"sabotage '{name}' passed: rel err {err:.2e}"  # each is 0.2-0.4 here


def _prefill_logits(model, chunks, prompts, bs=4):
    """Prefill each prompt in ``chunks`` pieces (all sequences per forward) through a paged cache -> logits of every
    prompt token [sum, V] in prompt order."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
    from torchinferno.models.deepseek_v4.family import kv_spec

    p = next(model.parameters())
    dev, dtype = p.device, p.dtype
    B = len(prompts)
    per_seq = -(-max(len(x) for x in prompts) // bs)
    caches = kv_spec(model.config).allocate(num_blocks=per_seq * B + 1, block_size=bs, dtype=dtype, device=dev)
    table = [[1 + per_seq * b + j for j in range(per_seq)][::-1] for b in range(B)]
    outs = [[] for _ in prompts]
    done = [0] * B
    with torch.no_grad():
        for c in range(chunks):
            ends = [len(x) * (c + 1) // chunks for x in prompts]
            lens = [e - d for e, d in zip(ends, done)]
            ids = torch.cat([torch.tensor(x[d:e]) for x, d, e in zip(prompts, done, ends)]).to(dev)
            meta = build_attention_metadata(lens, list(done), table, bs, device=dev)
            h = model(ids, positions_for(lens, list(done)).to(dev), caches, meta)
            logits = model.compute_logits(h).float()
            s = 0
            for b, n in enumerate(lens):
                outs[b].append(logits[s : s + n])
                s += n
            done = ends
    return torch.cat([torch.cat(o) for o in outs])


def check_model(device, dtype=torch.float32) -> None:
    from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
    from torchinferno.models.deepseek_v4.model import V4Attention, randomize_untrained_
    from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

    torch.manual_seed(0)
    model = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=3).to(device)
    attns = [m for m in model.modules() if isinstance(m, V4Attention)]
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 19, 30)]  # past CSA top-k, HCA windows
    exact = None
    if dtype != torch.float32:
        for a in attns:
            a.sparse_kernel = False
        exact = {chunks: _prefill_logits(model, chunks, prompts) for chunks in (1, 3)}  # low precision: CUDA only
        model = model.to(dtype)
    # 3 chunks: the first is a fresh prompt, the others read a cached context; the interpreter (slow) runs only that
    chunk_counts = (3,) if device.type == "cpu" else (1, 3)
    with _Counted() as c:
        try:
            for chunks in chunk_counts:
                for a in attns:
                    a.sparse_kernel = True
                n0 = len(c.calls)
                got = _prefill_logits(model, chunks, prompts)
                assert len(c.calls) > n0 and all(c.calls[n0:]), "the prefill kernel was not used"
                for a in attns:
                    a.sparse_kernel = False
                n0 = len(c.calls)
                want = _prefill_logits(model, chunks, prompts)
                assert len(c.calls) == n0, "the torch path called the kernel"
                err = _rel(got, want)
                if exact is None:  # fp32: the two paths agree to summation order
                    tol = 1e-5 if device.type == "cpu" else 1e-4  # CUDA: cuBLAS vs the kernel's order, 4 layers
                    assert err <= tol, f"{chunks} chunk(s): kernel prefill vs torch: rel err {err:.2e}"
                    assert torch.equal(got.argmax(-1), want.argmax(-1))
                else:  # low precision: the kernel path no further from the fp32 model than the torch path is
                    e_k, e_t = _rel(got, exact[chunks]), _rel(want, exact[chunks])
                    assert e_k <= 2 * e_t + 5e-3, f"{chunks} chunk(s): kernel {e_k:.2e} vs torch {e_t:.2e} from fp32"
        finally:
            for a in attns:
                a.sparse_kernel = True


def main() -> None:
    sys.path[:0] = [str(Path(__file__).resolve().parent)]
    from triton_interpreter_checks import run_checks  # the interpreter patches (Triton dispatch accepts CPU tensors)

    def kernel(cpu):
        check_kernel(cpu, torch.float32)
        check_kernel(cpu, torch.float16)  # rounds its logits as bf16 does; the interpreter has no bf16 (CUDA only)
        check_sabotage(cpu, torch.float32)

    run_checks({"kernel": kernel, "model": check_model})


if __name__ == "__main__":
    main()
