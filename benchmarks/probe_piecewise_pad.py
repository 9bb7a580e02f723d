"""Is a piecewise step's difference from the eager forward the padding (GEMM shapes) or the graphs? For the shapes of
probe_piecewise.py whose token count is not a bucket: max |diff| of graphs vs eager, of the same padded segments run
eagerly (PiecewiseGraphRunner(use_graphs=False)) vs eager, and of graphs vs padded eager.

    python benchmarks/probe_piecewise_pad.py [--size llama3-8b]
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    from probe_piecewise import make_step, shapes

    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.kernels.cuda_graphs_piecewise import PiecewiseGraphRunner, piecewise_buckets

    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="llama3-8b")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    model = build_model(ModelSpec(model_kind="llama3", size=a.size, dtype="bfloat16", device=a.device))
    caches = model.family.kv_spec(model.config).allocate(3000, 16, torch.bfloat16, a.device)
    graphs = PiecewiseGraphRunner(model, caches, 16, piecewise_buckets(512))
    graphs.capture()
    padded = PiecewiseGraphRunner(model, caches, 16, piecewise_buckets(512), use_graphs=False)
    with torch.inference_mode():
        for name, seqs in list(shapes(512, 128).items())[:2] + [("8 dec + 100 prompt", [(512, 1)] * 8 + [(0, 100)])]:
            ids, pos, meta = make_step(seqs, 16, 3000, model.config.vocab_size, a.device)
            want = model(ids, pos, caches, meta).float()
            g = graphs.run(ids, pos, meta).float().clone()
            p = padded.run(ids, pos, meta).float().clone()
            d = lambda x, y: (x - y).abs().max().item()  # noqa: E731
            print(f"{name} T={ids.shape[0]} bucket {graphs.bucket_for(ids.shape[0])}: graphs-eager {d(g, want):.3g}  "
                  f"padded eager-eager {d(p, want):.3g}  graphs-padded eager {d(g, p):.3g}", flush=True)


if __name__ == "__main__":
    main()
