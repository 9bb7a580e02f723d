"""Serving at the engine's pace (issue 17): ``serve`` vs ``LLM.generate`` on the same shapes, in one run.

Phase 1, offline: one ``LLM`` over a random model of ``--model-kind/--model-size`` (default: Llama-3-8B
shape, bf16), defaults only (plus ``--offline-extra`` engine kwargs); for each concurrency C it generates
``N(C)`` random-token prompts in waves of C (equal lengths + ignore_eos: every wave is a batch of C for
its whole life) and reports output tok/s; at C=1 also the per-token step time. Then the same engine
with async scheduling off at C=1 and C=64 (A/B: on is the CUDA default).
Phase 2, online: ``torchinferno serve`` (engine core in its own process) as a subprocess with the same
model and default flags (and once per ``--serve-variants`` entry), then ``bench-serve`` (streaming /v1/completions,
ignore_eos) at each C with ``N(C)`` prompts: output tok/s, TTFT p50/p99, ITL p50.

Prints one table and writes everything to ``--json-output``. Run on the device machine from the repo root:
    PYTHONPATH=src python3 benchmarks/serve_vs_offline.py --device cuda --json-output $OUT/serve_vs_offline.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shlex
import sys
import time


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(length)] for _ in range(n)]  # byte-tokenizer ids


def offline(args, counts: dict[int, int]) -> dict:
    import torch

    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.engine.llm import LLM

    spec = (ModelSpec(model=args.model, dtype=args.dtype, device=args.device) if args.model else
            ModelSpec(model_kind=args.model_kind, size=args.model_size, dtype=args.dtype, device=args.device))
    t0 = time.perf_counter()
    model = build_model(spec)
    print(f"model built in {time.perf_counter() - t0:.1f} s", flush=True)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    out: dict = {}

    def run(llm, c: int, n: int) -> dict:
        prompts = _prompts(n, args.input_len, seed=c)
        t = time.perf_counter()
        toks = 0
        for i in range(0, n, c):
            res = llm.generate(prompts[i:i + c], params, use_tqdm=False)
            toks += sum(len(r.token_ids) for r in res)
        dt = time.perf_counter() - t
        return {"concurrency": c, "prompts": n, "seconds": dt, "output_tok_s": toks / dt,
                "ms_per_token_per_seq": dt / (n // c) / args.output_len * 1e3}

    for name, kw in (("defaults", {}), ("sync", {"async_scheduling": False})):
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        t = time.perf_counter()
        llm = LLM(model, tokenizer=None if args.model else "byte", **kw, **args.offline_extra)
        print(f"[offline {name}] engine ready in {time.perf_counter() - t:.1f} s: {llm.engine.describe()}", flush=True)
        cs = args.concurrency if name == "defaults" else [c for c in (1, 64) if c in counts]
        rows = []
        for c in cs:
            r = run(llm, c, counts[c])
            rows.append(r)
            print(f"[offline {name}] C={c:4d}: {r['output_tok_s']:9.1f} tok/s ({r['ms_per_token_per_seq']:.2f} ms/step)",
                  flush=True)
        out[name] = rows
        del llm
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def online(args, counts: dict[int, int], extra: str) -> list[dict]:
    from torchinferno.bench.local_server import LocalServer, free_port
    from torchinferno.bench.serve_client import ServeBenchConfig, run_serve_bench

    port = free_port()
    which = [args.model] if args.model else ["--model-kind", args.model_kind, "--model-size", args.model_size]
    argv = ["torchinferno", "serve", *which, "--device", args.device, "--dtype", args.dtype, "--port", str(port), *shlex.split(extra)]
    rows = []
    t = time.perf_counter()
    with LocalServer(argv, port, log_path=args.server_log, startup_timeout_s=args.startup_timeout) as s:
        print(f"[serve] ready in {time.perf_counter() - t:.1f} s ({' '.join(argv[1:])})", flush=True)
        for c in args.concurrency:
            for client in args.http_clients:
                cfg = ServeBenchConfig(base_url=s.base_url, num_prompts=counts[c], input_len=args.input_len,
                                       output_len=args.output_len, max_concurrency=c, ignore_eos=True, seed=c,
                                       disable_tqdm=True, num_warmups=min(2, c), prompt_format="tokens",
                                       http_client=client).validate()
                r = run_serve_bench(cfg, log=lambda *_: None)
                row = {"flags": extra, "client": r["http_client"], "concurrency": c, "prompts": counts[c],
                       "output_tok_s": r["output_throughput"], "ttft_p50_ms": r["median_ttft_ms"],
                       "ttft_p99_ms": r["p99_ttft_ms"], "itl_p50_ms": r["median_itl_ms"],
                       "tpot_p50_ms": r["median_tpot_ms"], "completed": r["completed"]}
                rows.append(row)
                print(f"[serve {extra or 'defaults'} | {row['client']}] C={c:4d}: {row['output_tok_s']:9.1f} tok/s  "
                      f"TTFT p50 {row['ttft_p50_ms']:.0f} ms p99 {row['ttft_p99_ms']:.0f} ms  ITL p50 "
                      f"{row['itl_p50_ms']:.2f} ms  TPOT p50 {row['tpot_p50_ms']:.2f} ms  ({row['completed']}/{counts[c]})",
                      flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a checkpoint (registry name, HF dir, ...) instead of a random model")
    p.add_argument("--model-kind", default="llama3")
    p.add_argument("--model-size", default="llama3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--waves", type=int, default=4, help="prompts per concurrency = waves x C (at least 8)")
    p.add_argument("--offline-extra", type=json.loads, default={}, help='LLM engine kwargs as JSON, e.g. {"max_num_seqs": 256}')
    p.add_argument("--serve-variants", nargs="+", default=[""],
                   help="one server run per entry, each a string of extra serve flags ('' = defaults)")
    p.add_argument("--http-clients", nargs="+", default=["auto"], choices=["auto", "aiohttp", "httpx"],
                   help="bench-serve's client library for the streams; several = one run each, same server")
    p.add_argument("--phases", default="offline,online")
    p.add_argument("--server-log", default="/tmp/serve_vs_offline_server.log")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--json-output", default=None)
    args = p.parse_args(argv)
    counts = {c: max(8, args.waves * c) if c < 256 else 2 * c for c in args.concurrency}
    res = {"args": vars(args), "counts": counts}
    if "offline" in args.phases:
        res["offline"] = offline(args, counts)
    if "online" in args.phases:
        res["online"] = [row for extra in args.serve_variants for row in online(args, counts, extra)]
    if "offline" in res and "online" in res:
        base = {r["concurrency"]: r for r in res["offline"]["defaults"]}
        print("\nserve flags | client          C     serve tok/s   LLM.generate tok/s   ratio   serve TTFT p99   "
              "serve ITL p50 / offline step")
        for r in res["online"]:
            b = base[r["concurrency"]]
            print(f"{(r['flags'] or 'defaults') + ' | ' + r['client']:27s} {r['concurrency']:<5d} {r['output_tok_s']:11.1f}   {b['output_tok_s']:18.1f}   "
                  f"{r['output_tok_s'] / b['output_tok_s']:5.2f}   {r['ttft_p99_ms']:12.0f} ms   "
                  f"{r['itl_p50_ms']:.2f} / {b['ms_per_token_per_seq']:.2f} ms")
    if args.json_output:
        with open(args.json_output, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
