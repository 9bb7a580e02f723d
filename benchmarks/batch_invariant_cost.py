"""What ``--batch-invariant`` costs: output tok/s of plain vs batch-invariant engines at concurrency C, one process.

One random model of ``--model-kind/--model-size`` is built once. The plain engine runs first (batch-invariant
mode transforms the model in place: ``kernels.batch_invariant``), then the batch-invariant one; each engine gets
a short warm-up, then for each C in ``--concurrency`` one ``generate`` of C random-token prompts of
``--input-len`` tokens, ``--output-len`` greedy tokens each (ignore_eos). Also checks the property itself on the
way: request 0 of the largest C gets the same tokens as the same request alone (batch-invariant engine).
Prints a table (C, plain tok/s, invariant tok/s, ratio). Kept small so an 8B shape finishes well within 120 s
on an H200:
    PYTHONPATH=src python3 benchmarks/batch_invariant_cost.py --model-kind llama3 --model-size llama3-8b --device cuda
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time


def _run(llm, prompts, params) -> tuple[float, list[list[int]]]:
    """(output tok/s, token ids per prompt) of one generate call."""
    t = time.perf_counter()
    res = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    return sum(len(r.token_ids) for r in res) / dt, [list(r.token_ids) for r in res]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-kind", default="llama3")
    p.add_argument("--model-size", default="llama3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--json-output", default=None)
    args = p.parse_args(argv)

    import torch

    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.engine.llm import LLM

    t0 = time.perf_counter()
    model = build_model(ModelSpec(model_kind=args.model_kind, size=args.model_size, dtype=args.dtype, device=args.device))
    print(f"model built in {time.perf_counter() - t0:.1f} s", flush=True)
    rng = random.Random(0)
    cmax = max(args.concurrency)
    prompts = [[rng.randrange(3, 256) for _ in range(args.input_len)] for _ in range(cmax)]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    max_len = args.input_len + args.output_len + 16
    results: dict[str, dict[int, float]] = {}
    check = {}
    for mode in ("plain", "batch_invariant"):
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        llm = LLM(model, tokenizer="byte", max_model_len=max_len, batch_invariant=mode == "batch_invariant")
        _run(llm, prompts[:2], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
        print(f"{mode}: engine ready in {time.perf_counter() - t0:.1f} s ({llm.engine.describe()})", flush=True)
        results[mode] = {}
        for c in args.concurrency:
            tps, toks = _run(llm, prompts[:c], params)
            results[mode][c] = tps
            print(f"  {mode:16s} C={c:<4d} {tps:9.1f} out tok/s", flush=True)
            if mode == "batch_invariant" and c == cmax:
                check["batched"] = toks[0]
            if mode == "batch_invariant" and c == 1:
                check["alone"] = toks[0]
        del llm
    same = check.get("alone") == check.get("batched")
    print(f"\nbatch-invariant: request 0 alone == inside C={cmax}: {same}")
    print(f"\n{'C':>4s} {'plain tok/s':>12s} {'invariant tok/s':>16s} {'ratio':>7s}")
    for c in args.concurrency:
        a, b = results["plain"][c], results["batch_invariant"][c]
        print(f"{c:4d} {a:12.1f} {b:16.1f} {b / a:7.2f}")
    if args.json_output:
        with open(args.json_output, "w") as f:
            json.dump({"args": vars(args), "tok_s": results, "alone_equals_batched": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
