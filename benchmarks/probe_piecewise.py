"""Mixed steps eager vs piecewise vs whole-step CUDA graphs, at the model level on one device.

Run 73's served step logs had steps that mix decodes with a prefill chunk at 24-55 ms of host time on an 8B Llama
(H100), against ~1 ms for a graph prefill: such steps are host-bound. Piecewise graphs (kernels.cuda_graphs_piecewise)
took them to 9-12 ms of launch under ``serve`` (run 76), still host-bound: 32 eager attention calls. This probe times,
per step shape, the wall time of one step (launch + device, synchronized), in one process on the same weights and KV
cache:

* eager: ``model(ids, positions, kv, meta)`` (what the engine ran for these steps before session 28);
* piecewise: ``PiecewiseGraphRunner.run`` (graphed segments, attention eager; the engine's default);
* full: ``MixedGraphRunner.run`` (one graph per token bucket, attention inside on padded metadata;
  ``--cuda-graph-mixed-mode full``); full-tiles: the same with decode rows computed on whole query tiles (what the
  varlen kernel did before it got its one-token-query path);
* device: each graph step's kernels alone, from CUDA events around a replay that was queued behind a long sleep
  kernel (so the host launch is hidden): the floor they approach.

and checks that each graph runner's hidden states equal the eager ones (max |diff|, bf16).

    python benchmarks/probe_piecewise.py [--size llama3-8b] [--modes piecewise,full,full-tiles] [--iters 20]
        [--json-output F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

def shapes(ctx: int, prompt: int) -> dict:
    """name -> [(cached context, new tokens)] per sequence: decodes at context ``ctx`` beside prompts."""
    return {
        f"1 dec + {prompt} prompt": [(ctx, 1)] + [(0, prompt)],
        f"16 dec + {prompt} prompt": [(ctx, 1)] * 16 + [(0, prompt)],
        f"64 dec + {prompt} prompt": [(ctx, 1)] * 64 + [(0, prompt)],
        f"256 dec + {prompt} prompt": [(ctx, 1)] * 256 + [(0, prompt)],
        f"2 prompts x {prompt}": [(0, prompt)] * 2,
        f"32 dec + {2 * prompt} chunk over {2 * ctx}": [(ctx, 1)] * 32 + [(2 * ctx, 2 * prompt)],
    }


def make_step(shapes, block_size, num_blocks, vocab, device):
    from torchinferno.models.common.attention_metadata import AttentionMetadata

    width = max(-(-(c + q) // block_size) for c, q in shapes)
    tables, slots, pos, qsl, lens, nxt = [], [], [], [0], [], 1
    for c, q in shapes:
        nb = -(-(c + q) // block_size)
        row = [(nxt + j) % (num_blocks - 1) + 1 for j in range(nb)]
        nxt += nb
        tables.append(row + [0] * (width - nb))
        slots += [row[p // block_size] * block_size + p % block_size for p in range(c, c + q)]
        pos += list(range(c, c + q))
        qsl.append(qsl[-1] + q)
        lens.append(c + q)
    i32 = dict(dtype=torch.int32, device=device)
    meta = AttentionMetadata(torch.tensor(qsl, **i32), torch.tensor(lens, **i32),
                             torch.tensor(slots, dtype=torch.long, device=device), torch.tensor(tables, **i32),
                             block_size, [q for _, q in shapes], lens)
    ids = torch.randint(1, vocab, (qsl[-1],), device=device)
    return ids, torch.tensor(pos, dtype=torch.long, device=device), meta


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, iters):
    ms = []
    for _ in range(iters):
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms), min(ms)


def device_ms(fn, iters):
    """Kernel time of ``fn`` with its launch hidden behind a sleep kernel queued first (NaN without CUDA)."""
    if not torch.cuda.is_available():
        return float("nan")
    out = []
    for _ in range(iters):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000_000)  # ~100+ ms of GPU sleep: the whole launch is queued before it ends
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="llama3-8b")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=6000)
    ap.add_argument("--ctx", type=int, default=512, help="cached context of every decode row")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (no graphs, no device time)")
    ap.add_argument("--modes", default="piecewise,full,full-tiles",
                    help="graph runners to time beside eager (comma-separated: piecewise, full, full-tiles)")
    ap.add_argument("--json-output", default=None)
    a = ap.parse_args()
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.kernels.cuda_graphs_mixed import MixedGraphRunner
    from torchinferno.kernels.cuda_graphs_piecewise import PiecewiseGraphRunner, piecewise_buckets

    dev = a.device
    model = build_model(ModelSpec(model_kind="llama3", size=a.size, dtype="bfloat16", device=dev))
    bs = 16
    caches = model.family.kv_spec(model.config).allocate(a.blocks, bs, torch.bfloat16, dev)
    max_blocks = -(-(4 * a.ctx + 4 * a.prompt) // bs)
    def full(decode_rows: bool):
        """A whole-step runner captured with decode rows on their heads' rows (the default) or on whole tiles."""
        attn = [m for m in model.modules() if hasattr(m, "mixed_decode_rows")]
        for m in attn:
            m.mixed_decode_rows = decode_rows  # read while capturing: the graphs keep the choice
        try:
            r = MixedGraphRunner(model, caches, bs, max_blocks, piecewise_buckets(512))
            r.capture()
        finally:
            for m in attn:
                m.mixed_decode_rows = True
        return r

    def piecewise():
        r = PiecewiseGraphRunner(model, caches, bs, piecewise_buckets(512))
        r.capture()
        return r

    make = {"piecewise": piecewise, "full": lambda: full(True), "full-tiles": lambda: full(False)}
    modes = [m for m in a.modes.split(",") if m]
    unknown = [m for m in modes if m not in make]
    if unknown:
        raise SystemExit(f"--modes takes {', '.join(make)}, got {', '.join(unknown)}")
    dname = torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu"
    runners, capture_s = {}, {}
    for m in modes:
        t = time.perf_counter()
        runners[m] = make[m]()
        capture_s[m] = time.perf_counter() - t
        print(f"{a.size} on {dname}: {m} captured in {capture_s[m]:.1f} s; "
              f"{torch.cuda.memory_reserved() / 2**30 if dev.startswith('cuda') else 0:.1f} GiB reserved in all")
    rows = []
    with torch.inference_mode():
        for name, seqs in shapes(a.ctx, a.prompt).items():
            ids, pos, meta = make_step(seqs, bs, a.blocks, model.config.vocab_size, dev)
            n = ids.shape[0]
            want = model(ids, pos, caches, meta).float()
            eager = timed(lambda: model(ids, pos, caches, meta), a.iters)
            r = {"shape": name, "tokens": n, "seqs": len(seqs), "eager_ms": eager[0], "eager_min_ms": eager[1],
                 "device_eager_ms": device_ms(lambda: model(ids, pos, caches, meta), max(3, a.iters // 4)),
                 "ref_max_abs": want.abs().max().item()}
            line = f"{name:32s} T={n:4d}: eager {eager[0]:7.2f} ms"
            for m, run in runners.items():
                got = run.run(ids, pos, meta).float()
                r[f"{m}_max_abs_diff"] = (got - want).abs().max().item()
                w = timed(lambda: run.run(ids, pos, meta), a.iters)
                r[f"{m}_ms"], r[f"{m}_min_ms"] = w
                r[f"device_{m}_ms"] = device_ms(lambda: run.run(ids, pos, meta), max(3, a.iters // 4))
                line += (f"  {m} {w[0]:7.2f} ms (x{eager[0] / w[0]:.2f}, device {r[f'device_{m}_ms']:6.2f}, "
                         f"max|diff| {r[f'{m}_max_abs_diff']:.3g})")
            rows.append(r)
            print(line + f"  device eager {r['device_eager_ms']:6.2f} ms (ref max {r['ref_max_abs']:.3g})")
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump({"size": a.size, "device": dname, "capture_s": capture_s, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
