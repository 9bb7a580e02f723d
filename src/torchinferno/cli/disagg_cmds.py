"""Disaggregated rank files (thin: ``torchinferno.runtime.disagg``): ``disagg-init`` writes one editable Python file
per prefill/decode rank; ``disagg-smoke`` sends one request through a live prefill rank and decode rank."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("disagg-init", help="write one standalone, editable rank file per prefill/decode rank",
                       description="Write DIR/rank_<r>_prefill.py and rank_<r>_decode.py (port = base port + rank), "
                                   "manifest.json and README.md. Each file owns one model and serves a local HTTP RPC.")
    p.add_argument("dir", help="output directory (created)")
    p.add_argument("--prefill-ranks", type=int, default=1)
    p.add_argument("--decode-ranks", type=int, default=1)
    p.add_argument("--base-port", type=int, default=8800)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (checked when a rank file starts)")
    p.add_argument("--host", default="127.0.0.1")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="registry name, HF dir or .gguf (default: the default model if "
                                                   "converted locally, else a tiny random --family model)")
    src.add_argument("--family", "--model-kind", dest="family", default=None,
                     help="a tiny random model of this family (llama3, deepseek, dsv4, deepseek_v4; seeded)")
    p.add_argument("--size", default="debug", help="size of the tiny --family model (default: debug)")
    p.add_argument("--seed", type=int, default=0, help="weight seed of the tiny model (identical on every rank)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: float32 (bfloat16 for a checkpoint on CUDA)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=256, help="KV blocks per rank")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto (float32 on CPU, the model's dtype on CUDA), bfloat16, float16, float32, fp8, fp8_e5m2; "
                        "FP8 KV moves as stored")
    p.add_argument("--kv-ttl-s", type=float, default=60.0,
                   help="a prefill rank frees a request's held KV after this long without /release")
    p.set_defaults(func=_init)

    s = sub.add_parser("disagg-smoke", help="send one request through a live prefill rank and decode rank",
                       description="Prefill on --prefill-url, move the prompt's KV to --decode-url, decode there; print "
                                   "the tokens, the KV bytes moved and timings. --check compares with a local "
                                   "colocated generation of the same model.")
    s.add_argument("--prefill-url", required=True, nargs="+", help="one or more prefill ranks (round robin)")
    s.add_argument("--decode-url", required=True, nargs="+", help="one or more decode ranks (round robin)")
    s.add_argument("--prompt", type=int, nargs="+", required=True, help="prompt token ids")
    s.add_argument("--new-tokens", type=int, default=2, help="tokens to generate (the first comes from the prefill)")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-k", type=int, default=-1)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("--check", action="store_true",
                   help="also generate locally (colocated, same model and sampling) and fail unless tokens match")
    s.add_argument("--requests", type=int, default=1,
                   help="send this many requests (request i > 0: the prompt plus one varying token)")
    s.add_argument("--concurrency", type=int, default=1,
                   help="requests in flight at once: one request's prefill overlaps another's decode")
    s.add_argument("--timeout-s", type=float, default=120.0)
    s.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    s.set_defaults(func=_smoke)


def _init(a: argparse.Namespace) -> int:
    from torchinferno.runtime.disagg_files import RankFilesSpec, write_rank_files

    spec = RankFilesSpec(prefill_ranks=a.prefill_ranks, decode_ranks=a.decode_ranks, base_port=a.base_port,
                         device=a.device, host=a.host, model=a.model, family=a.family, size=a.size, seed=a.seed,
                         dtype=a.dtype, block_size=a.block_size, num_blocks=a.num_blocks, kv_ttl_s=a.kv_ttl_s,
                         kv_cache_dtype=a.kv_cache_dtype)
    files = write_rank_files(a.dir, spec)
    for f in files:
        print(f)
    print(f"wrote {len(files)} rank files, manifest.json and README.md to {a.dir}; start each with: python3 FILE")
    return 0


def _smoke(a: argparse.Namespace) -> int:
    import json
    import time
    from concurrent.futures import ThreadPoolExecutor

    from torchinferno.errors import ConfigError
    from torchinferno.runtime.disagg_http import RankClient, run_disagg_request

    if a.requests < 1 or a.concurrency < 1:
        raise ConfigError(f"--requests and --concurrency must be >= 1, got {a.requests}, {a.concurrency}")
    sampling = {"max_tokens": a.new_tokens, "temperature": a.temperature, "top_k": a.top_k, "top_p": a.top_p,
                "seed": a.seed, "ignore_eos": a.ignore_eos}
    prefills = [RankClient(u, a.timeout_s) for u in a.prefill_url]
    decodes = [RankClient(u, a.timeout_s) for u in a.decode_url]
    for flag, clients, role in (("--prefill-url", prefills, "prefill"), ("--decode-url", decodes, "decode")):
        for c in clients:
            h = c.health()
            if h["role"] != role:
                raise ConfigError(f"{flag} {c.url} serves a {h['role']} rank, not a {role} rank")
    hp = prefills[0].health()
    base = list(a.prompt)
    # Request i > 0 appends one varying token: distinct prompts sharing the given prefix (prefix-cache hits).
    prompts = [base] + [base + [(base[-1] + i) % hp["vocab_size"]] for i in range(1, a.requests)]

    def one(i: int):
        return run_disagg_request(prefills[i % len(prefills)], decodes[i % len(decodes)], prompts[i], sampling)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(a.concurrency, a.requests)) as pool:
        results = list(pool.map(one, range(a.requests)))
    wall = time.perf_counter() - t0
    rows = []
    for prompt, res in zip(prompts, results):
        expect = 0 if res.finish_reason and res.kv_bytes == 0 else len(prompt) * hp["kv_bytes_per_token"]
        rows.append({"request_id": res.request_id, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
                     "kv_bytes": res.kv_bytes, "kv_bytes_expected": expect, "wire_bytes": res.wire_bytes,
                     "timings_ms": {k.removesuffix("_s"): round(v * 1e3, 3) for k, v in res.timings.items()}})
    if a.check:
        for row, ref in zip(rows, _colocated(hp, prompts, sampling)):
            row["colocated_token_ids"] = ref
    summary = {"requests": a.requests, "wall_ms": round(wall * 1e3, 3), "requests_per_s": round(a.requests / wall, 3),
               "kv_bytes_total": sum(r["kv_bytes"] for r in rows)}
    if a.json:
        print(json.dumps(rows[0] if a.requests == 1 else {**summary, "results": rows}))
    else:
        for prompt, row in zip(prompts, rows):
            tag = "" if a.requests == 1 else f"[{row['request_id']}] "
            print(f"{tag}tokens: {' '.join(map(str, row['token_ids']))} (finish: {row['finish_reason']})")
            print(f"{tag}kv bytes moved: {row['kv_bytes']} ({len(prompt)} prompt tokens x {hp['kv_bytes_per_token']} "
                  f"B, {hp['family']} {hp['kv_dtype']}); wire bytes: {row['wire_bytes']}")
            print(f"{tag}timings: " + ", ".join(f"{k} {v} ms" for k, v in row["timings_ms"].items()))
            if a.check:
                print(f"{tag}colocated: {' '.join(map(str, row['colocated_token_ids']))}")
        if a.requests > 1:
            print(f"{a.requests} requests (concurrency {a.concurrency}) in {summary['wall_ms']} ms: "
                  f"{summary['requests_per_s']} requests/s, {summary['kv_bytes_total']} KV bytes moved")
    for row in rows:
        if row["kv_bytes"] != row["kv_bytes_expected"]:
            raise ConfigError(f"request {row['request_id']}: KV bytes moved {row['kv_bytes']} != prompt tokens x KV "
                              f"bytes per token = {row['kv_bytes_expected']}")
        if a.check and row["colocated_token_ids"] != row["token_ids"]:
            raise ConfigError(f"request {row['request_id']}: disaggregated tokens {row['token_ids']} != colocated "
                              f"tokens {row['colocated_token_ids']}")
    if a.check and not a.json:
        print("check: disaggregated tokens == colocated tokens")
    return 0


def _colocated(health: dict, prompts: list[list[int]], sampling: dict) -> list[list[int]]:
    """The same model (from the prefill rank's /health), generated here in one process, one prompt at a time."""
    import torch

    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.engine.generate import StaticGenerator
    from torchinferno.errors import ConfigError

    device = health["device"]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--check: the ranks run on {device}, which this machine does not have")
    spec = ModelSpec(model=health["model"], model_kind=health["model_kind"], size=health["size"], seed=health["seed"],
                     dtype=health["dtype"], device=device, prepack=False)
    model = build_model(spec)
    sp = SamplingParams(**sampling)
    gen = StaticGenerator(model, 1, max(map(len, prompts)) + sp.max_tokens,
                          cache_dtype=getattr(torch, health["kv_dtype"]))
    return [gen.generate([p], sp)[0].token_ids for p in prompts]
