"""Engine warm-up: throwaway requests through the real step path before real traffic or a timed run.

The first step of each shape pays one-time costs that belong to no request: Triton compiles every
kernel variant on first use (the paged prefill attention, FP8 quantizers, the specialization of an
integer argument that is or is not a multiple of 16, ...), cuBLAS picks and loads kernels for new
GEMM shapes, the caching allocator grows. On a fresh H200 machine the warm-up itself took 2.9 s (bf16)
and 3.3 s (FP8 KV cache) in bench-gpu run 27: time earlier runs' (d) windows included. ``warmup_engine`` meets those shapes on purpose: one full token budget of
prompts (a pure prefill step, then a mixed step of decode rows + a prompt chunk), decode steps,
then one lone prompt of odd length (the single-sequence fresh-prompt route).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from torchinferno.core.sampling_params import SamplingParams


@dataclass
class WarmupReport:
    seconds: float
    requests: int
    prompt_len: int
    steps: int


def _counters(engine) -> dict:
    """Every statistic ``LLMEngine.stats()`` accumulates, by owner and attribute name."""
    core = engine.core
    return {
        core: ("_steps", "_max_seqs", "_max_tokens", "_computed_tokens", "_gen_tokens", "_finished", "_aborted"),
        core.scheduler: ("num_preemptions",),
        engine.runner: ("num_forward_calls", "num_graph_steps"),
        core.pool: ("prefix_queries", "prefix_hits", "num_evictions"),
    }


def warmup_engine(engine, prompt_len: int | None = None, max_tokens: int = 4, seed: int = 0) -> WarmupReport:
    """Run throwaway requests to completion on an idle ``engine``; leave its statistics as they were and,
    when its prefix cache was empty, empty it again.

    ``prompt_len``: the prompt length of the workload to come (default: min(1024, one step's token budget,
    the context length less ``max_tokens``)). Raises ``RuntimeError`` if a request is in flight.
    """
    if engine.has_unfinished():
        raise RuntimeError("warmup needs an idle engine: requests are in flight")
    cfg = engine.config
    room = engine.max_model_len - max_tokens
    if room < 1:
        raise RuntimeError(f"warmup: max_model_len {engine.max_model_len} leaves no room for a prompt")
    plen = max(1, min(prompt_len or 1024, cfg.max_num_batched_tokens, room))
    per_req = plen + max_tokens + engine.pool.block_size
    fits = max(1, engine.kv_cache.num_tokens // per_req)
    n = max(1, min(-(-cfg.max_num_batched_tokens // plen) + 1, cfg.max_num_seqs, fits))
    lone = max(1, min(room, plen // 2) | 1)  # odd length

    saved = {owner: {a: getattr(owner, a) for a in attrs} for owner, attrs in _counters(engine).items()}
    cache_was_empty = engine.pool.num_cached_blocks == 0
    rng = random.Random(seed)
    vocab = engine.vocab_size or 2
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    steps = 0
    for batch in ([plen] * n, [lone]):
        for i, length in enumerate(batch):
            engine.add_request(f"__warmup_{steps}_{i}", [rng.randrange(vocab) for _ in range(length)], params)
        while engine.has_unfinished():
            engine.step()
            steps += 1
    seconds = time.perf_counter() - t0
    for owner, values in saved.items():
        for a, v in values.items():
            setattr(owner, a, v)
    if cache_was_empty:
        engine.pool.reset_prefix_cache()
    return WarmupReport(seconds=seconds, requests=n + 1, prompt_len=plen, steps=steps)
