"""``openai-server-microbench``: sequential single requests against one server, streaming and not.

One request at a time (no queueing) isolates a server's per-request latency: for streaming, TTFT,
TPOT (vLLM's definition) and e2e; for non-streaming, e2e and tokens/s from ``usage``. Targets
``--base-url`` or launches ``torchinferno serve`` on a free loopback port and stops it after.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from torchinferno.bench.serve_client import ServeBenchConfig, check_server, send_request
from torchinferno.bench.serve_prompts import make_prompts
from torchinferno.errors import ConfigError

__all__ = ["ServerMicrobenchConfig", "run_server_microbench", "format_server_microbench"]


@dataclass
class ServerMicrobenchConfig:
    base_url: str
    warmup: int = 2
    iters: int = 10
    prompt_tokens: int = 32
    max_tokens: int = 32
    model: str | None = None
    api_key: str | None = None
    seed: int = 0


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": float(np.mean(xs)) * 1000, "p50": float(np.percentile(xs, 50)) * 1000,
            "p99": float(np.percentile(xs, 99)) * 1000}


async def _run(cfg: ServerMicrobenchConfig) -> dict:
    import httpx

    scfg = ServeBenchConfig(base_url=cfg.base_url, input_len=cfg.prompt_tokens, output_len=cfg.max_tokens,
                            model=cfg.model, ignore_eos=True, api_key=cfg.api_key, num_prompts=1).validate()
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    async with httpx.AsyncClient(timeout=600, trust_env=False) as client:
        info = await check_server(client, scfg)
        model = info["model"]
        n = cfg.warmup + cfg.iters
        prompts, how = await make_prompts(client, scfg.base_url, model, n, cfg.prompt_tokens, cfg.seed, True)
        out = {"base_url": scfg.base_url, "model": model, "engine": info["engine"], "prompt_source": how,
               "prompt_tokens": cfg.prompt_tokens, "max_tokens": cfg.max_tokens, "warmup": cfg.warmup, "iters": cfg.iters}
        # streaming
        ttft, tpot, e2e, toks = [], [], [], []
        for i, p in enumerate(prompts):
            r = await send_request(client, scfg, model, p)
            if not r.success:
                raise ConfigError(f"streaming request failed: {r.error}")
            if i < cfg.warmup:
                continue
            ttft.append(r.ttft)
            e2e.append(r.latency)
            toks.append(r.output_tokens)
            if r.output_tokens > 1:
                tpot.append((r.latency - r.ttft) / (r.output_tokens - 1))
        out["stream"] = {"ttft_ms": _stats(ttft), "tpot_ms": _stats(tpot), "e2e_ms": _stats(e2e),
                         "output_tokens_per_s": sum(toks) / sum(e2e) if e2e else None}
        # non-streaming
        e2e, toks = [], []
        for i, p in enumerate(prompts):
            body = {"model": model, "prompt": p.value, "max_tokens": cfg.max_tokens, "ignore_eos": True,
                    "temperature": 0.0}
            t0 = time.perf_counter()
            r = await client.post(f"{scfg.base_url}/v1/completions", json=body, headers=headers)
            dt = time.perf_counter() - t0
            if r.status_code != 200:
                raise ConfigError(f"non-streaming request failed: HTTP {r.status_code}: {r.text[:200]}")
            if i < cfg.warmup:
                continue
            e2e.append(dt)
            toks.append(int((r.json().get("usage") or {}).get("completion_tokens") or 0))
        out["non_stream"] = {"e2e_ms": _stats(e2e), "output_tokens_per_s": sum(toks) / sum(e2e) if e2e else None}
        return out


def run_server_microbench(cfg: ServerMicrobenchConfig) -> dict:
    if cfg.iters < 1 or cfg.warmup < 0:
        raise ConfigError(f"--iters must be >= 1 and --warmup >= 0, got {cfg.iters}, {cfg.warmup}")
    return asyncio.run(_run(cfg))


def format_server_microbench(r: dict) -> str:
    def f(v):
        return "-" if v is None else f"{v:.2f}"

    s, ns = r["stream"], r["non_stream"]
    return "\n".join([
        f"openai-server-microbench: {r['base_url']} model '{r['model']}' (engine {r['engine']}), "
        f"{r['iters']} iters after {r['warmup']} warm-up, prompt {r['prompt_tokens']} / max_tokens {r['max_tokens']}",
        f"{'mode':<12}{'TTFT mean':>10}{'TTFT p99':>10}{'TPOT mean':>10}{'e2e mean':>10}{'e2e p99':>10}{'tok/s':>9}",
        f"{'stream':<12}{f(s['ttft_ms']['mean']):>10}{f(s['ttft_ms']['p99']):>10}{f(s['tpot_ms']['mean']):>10}"
        f"{f(s['e2e_ms']['mean']):>10}{f(s['e2e_ms']['p99']):>10}{f(s['output_tokens_per_s']):>9}",
        f"{'non-stream':<12}{'-':>10}{'-':>10}{'-':>10}{f(ns['e2e_ms']['mean']):>10}{f(ns['e2e_ms']['p99']):>10}"
        f"{f(ns['output_tokens_per_s']):>9}",
    ])
