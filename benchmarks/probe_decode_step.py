"""Probe: the fused batch-1 decode step (models/llama3/cuda_decode.py) on the Llama-3-8B shape under tile variants.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_decode_step.py [--pick|--ab|--attention]``. Times the
real kernel chain (CUDA-graph step and device loop at context 128, same accounting as ``bench-gpu`` (a)) for
the default GEMV tiles and a few variants, beside the same-run copy bandwidth.
"""

from __future__ import annotations

import sys

import torch

from torchinferno.bench.ceilings import copy_bandwidth
from torchinferno.bench.generate_bench import weight_bytes_per_step
from torchinferno.bench.gpu_decode import DecodeBench, build_random_model
from torchinferno.models.common.step_model import unwrap

VARIANTS = {
    "default": {},
    "qkv bn8 bk512 (before)": {"qkv": {"block_n": 8, "block_k": 512, "num_stages": 2}},
    "qkv bn2 bk2048": {"qkv": {"block_n": 2, "block_k": 2048, "num_stages": 3}},
    "qkv bn4 bk1024": {"qkv": {"block_n": 4, "block_k": 1024, "num_stages": 3}},
    "o bn2 bk2048": {"o": {"block_n": 2, "block_k": 2048, "num_stages": 3}},
    "gate_up bn4 bk2048": {"gate_up": {"block_n": 4, "block_k": 2048, "num_stages": 3}},
    "gate_up bn4 bk1024": {"gate_up": {"block_n": 4, "block_k": 1024, "num_stages": 3}},
    "down bn2 bk2048": {"down": {"block_n": 2, "block_k": 2048, "num_stages": 3}},
    "down bn8 bk1024": {"down": {"block_n": 8, "block_k": 1024, "num_stages": 3}},
}
# --ab (ctx 4096) and --attention (ctx 128 and 4096): the attention's tiling and split floor inside the step.
# Run 21: block_n 32, 8 warps, 3 stages and splits of >= 128 tokens were no better than the default; run 24: a
# second K/V tile read before the PDL wait (since removed) was 0.13-0.17 ms slower.
ATTENTION_VARIANTS = {
    "default": {},
    # 64 splits of 64 tokens at ctx 4096: every split one tile, all of it read before the PDL wait
    "attention 4 waves": {"attention": {"waves": 4}},
    "attention 4 waves, block_n 32": {"attention": {"waves": 4, "block_n": 32}},
}
# --pick: the candidates worth a second look, each measured twice, interleaved with the default (noise)
PICK = {
    "default": {},
    "qkv bn4 bk2048 + 4 stages": {"qkv": {"block_n": 4, "block_k": 2048, "num_stages": 4},
                                  **{k: {"num_stages": 4} for k in ("o", "gate_up", "down")}},
    "4 stages": {k: {"num_stages": 4} for k in ("qkv", "o", "gate_up", "down")},
}
OLD_ATTENTION = "_old_decode_attention"  # --ab: a copy of an earlier decode_attention.py beside this script


def _measure(bench, name, cfg, ctx, wbytes, bw, out) -> None:
    bench.set_fused_step(True, configs=cfg)
    r = bench.measure(1, ctx, wbytes, bw)
    out["variants"].setdefault(f"{name} @ {ctx}", []).append(
        {k: r[k] for k in ("step_ms", "step_device_ms", "loop_ms_per_step", "bound_ms", "fraction_of_bound")})
    print(f"{name:34s} ctx {ctx:4d} step {r['step_ms']:.3f} ms (device only {r['step_device_ms']:.3f}, loop "
          f"{r['loop_ms_per_step']:.3f}) -> {100 * r['fraction_of_bound']:.1f}% of bound "
          f"({100 * r['device_fraction_of_bound']:.1f}% device only, {100 * r['loop_fraction_of_bound']:.1f}% loop)",
          flush=True)


def _attention_ab(bench, wbytes, bw, out) -> None:
    """The step with this tree's decode attention vs an earlier copy (``OLD_ATTENTION``), interleaved, twice."""
    import importlib

    from torchinferno.kernels.triton import decode_attention as cur

    try:
        old = importlib.import_module(OLD_ATTENTION)
    except ImportError:
        print(f"(no {OLD_ATTENTION}.py beside the script: attention A/B skipped)")
        return
    new_fn = cur.batched_paged_decode_attention
    for _ in range(2):
        for ctx in (128, 4096):
            for tag, fn in (("attention: this tree", new_fn), ("attention: earlier copy", old.batched_paged_decode_attention)):
                cur.batched_paged_decode_attention = fn  # the API looks the function up at each call
                try:
                    _measure(bench, tag, {}, ctx, wbytes, bw, out)
                finally:
                    cur.batched_paged_decode_attention = new_fn


def _step_parts(bench, out) -> None:
    """The timed step's input copies vs the graph replay alone; the head through cuBLAS vs the decode GEMV."""
    import torch.nn.functional as F

    from torchinferno.bench.gpu_timing import cuda_time_ms, graph_time_ms
    from torchinferno.kernels import api as kapi

    bench.set_fused_step(True)
    ids, pos, bt = bench.inputs(1, 128)
    slots, lens = bench.slots(bt, pos), (pos + 1).to(torch.int32)
    bench.runner.run(ids, pos, slots, bt, lens)
    g = bench.runner.graphs[1]
    parts = {"step_ms": cuda_time_ms(lambda: bench.runner.run(ids, pos, slots, bt, lens), iters=30),
             "replay_only_ms": cuda_time_ms(g.replay, iters=30),
             "copies_only_ms": cuda_time_ms(lambda: bench.runner._load(ids, pos, slots, bt, lens, 1), iters=30)}
    model = unwrap(bench.model)
    w = model.head_weight()
    h = torch.randn(1, w.shape[1], device=w.device, dtype=w.dtype)
    nw = model.model.norm.weight
    heads = {"cublas linear + float": lambda: F.linear(h, w).float(),
             "decode_gemv + float": lambda: kapi.decode_gemv(h.view(-1), w).float(),
             "decode_gemv bn4 bk2048 + float": lambda: kapi.decode_gemv(
                 h.view(-1), w, config={"block_n": 4, "block_k": 2048, "num_stages": 3}).float(),
             "rms_norm + cublas linear + float": lambda: F.linear(kapi.rms_norm(h, nw, 1e-5), w).float(),
             "decode_gemv with norm prologue + float": lambda: kapi.decode_gemv(h.view(-1), w, norm_weight=nw).float(),
             "the step's compute_logits": lambda: bench.model.step.compute_logits(h)}
    for name, fn in heads.items():
        parts[f"head: {name} (us)"] = 1e3 * graph_time_ms(fn, calls=10, iters=10)
    out["step_parts"] = parts
    print("step parts: " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()), flush=True)


def main(pick: bool = False, ab: bool = False, attention: bool = False) -> dict:
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev, nbytes=2 * 1024**3, iters=5)
    model = build_random_model("llama3-8b", dev)
    wbytes = weight_bytes_per_step(model)
    bench = DecodeBench(model, max_batch=1, max_ctx=4096 + 64, buckets=(1,))
    out = {"copy_gb_s": bw / 1e9, "variants": {}}
    print(f"ceiling: copy {bw / 1e9:.0f} GB/s", flush=True)
    if ab:
        _step_parts(bench, out)
        _attention_ab(bench, wbytes, bw, out)
        runs = [(n, c, 128) for _ in range(2) for n, c in VARIANTS.items()]
        runs += [(n, c, 4096) for _ in range(2) for n, c in ATTENTION_VARIANTS.items()]
    elif attention:
        runs = [(n, c, ctx) for _ in range(2) for ctx in (4096, 128) for n, c in ATTENTION_VARIANTS.items()]
    elif pick:
        runs = [(n, c, ctx) for _ in range(2) for n, c in PICK.items() for ctx in (128, 4096)]
    else:
        runs = [(n, c, 128) for n, c in VARIANTS.items()]
    for name, cfg, ctx in runs:
        _measure(bench, name, cfg, ctx, wbytes, bw, out)
    return out


if __name__ == "__main__":
    from probe_io import (
        save_json_arg,  # this folder's helper (the script's directory is on sys.path)
    )

    save_json_arg(main(pick="--pick" in sys.argv, ab="--ab" in sys.argv, attention="--attention" in sys.argv))
