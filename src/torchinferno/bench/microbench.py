"""``openai-microbench``: where a request's time goes between the forward and the client.

Cases (each on a fresh engine, so forward counts and max batch are per case):

* ``direct``   — one request at a time, ``engine.step()`` called in the caller's thread: the floor.
* ``batcher``  — the same single requests forced through ``AsyncEngine`` (engine thread + queue
  hand-off to asyncio); ``--compare-batcher`` adds it and ``batcher-concurrent`` (C requests
  through ``AsyncEngine``, no HTTP) and reports the per-token overhead against ``direct``.
* ``concurrent`` — C requests at once through the real OpenAI server (FastAPI + uvicorn on
  loopback, SSE streaming), measured by the ``bench-serve`` client.

``--backend synthetic`` runs ``SyntheticEngine`` (no model; timed steps), so everything that is
not the synthetic step cost is Python dispatch, streaming and admission; ``--backend model``
runs the real ``LLMEngine`` on a model (``--model-kind llama3`` for a tiny random one).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from torchinferno.bench.synthetic_engine import SyntheticCost, SyntheticEngine
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.errors import ConfigError

__all__ = ["MicrobenchConfig", "CaseResult", "run_microbench", "format_cases", "in_thread_server"]


@dataclass
class MicrobenchConfig:
    backend: str = "synthetic"
    concurrency: int = 8
    prompt_tokens: int = 32
    max_tokens: int = 32
    prompt_mode: str = "random"  # random | self-consistency (every request shares one prompt)
    compare_batcher: bool = False
    phase_timings: bool = False
    profile_breakdown: bool = False
    single_requests: int = 3
    seed: int = 0
    cost: SyntheticCost = field(default_factory=SyntheticCost)
    model: str | None = None
    model_kind: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    tensor_parallel_size: int = 1  # model backend: > 1 spawns worker ranks per engine (engine.multiproc_executor)
    pipeline_parallel_size: int = 1  # model backend: > 1 stages of layers on that many ranks

    def validate(self) -> "MicrobenchConfig":
        if self.backend not in ("synthetic", "model"):
            raise ConfigError(f"unknown --backend {self.backend!r} (valid: synthetic, model)")
        if self.prompt_mode not in ("random", "self-consistency"):
            raise ConfigError(f"unknown --prompt-mode {self.prompt_mode!r} (valid: random, self-consistency)")
        for n in ("concurrency", "prompt_tokens", "max_tokens", "single_requests", "tensor_parallel_size",
                  "pipeline_parallel_size"):
            if getattr(self, n) < 1:
                raise ConfigError(f"--{n.replace('_', '-')} must be >= 1, got {getattr(self, n)}")
        if self.ranks > 1 and self.backend != "model":
            raise ConfigError("--tensor-parallel-size / --pipeline-parallel-size > 1 need --backend model")
        if self.ranks > 1 and self.phase_timings:
            raise ConfigError("--phase-timings times the in-process runner: not with worker ranks (use --profile-breakdown)")
        return self

    @property
    def ranks(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class CaseResult:
    case: str
    requests: int
    concurrency: int
    wall_s: float
    output_tokens: int
    ttft_ms: float
    p99_ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    output_tok_s: float
    forward_calls: int
    max_batch: int
    phases: dict | None = None
    profile: dict | None = None


# ------------------------------------------------------------------------------ engines
class _Backend:
    """What each case gets a fresh engine of: the synthetic engine, an in-process ``LLMEngine`` over one model built
    once, or (``ranks > 1``) an ``LLMEngine`` whose executor spawns its worker ranks (per case; :meth:`close` stops
    them)."""

    def __init__(self, cfg: MicrobenchConfig):
        self.cfg = cfg
        self.max_model_len = cfg.prompt_tokens + cfg.max_tokens + 32
        self.spec, self.parallel_engines = None, []
        if cfg.backend == "synthetic":
            from torchinferno.text.tokenizer import ByteTokenizer

            self.model, self.tokenizer, self.vocab = None, ByteTokenizer(), 256
        elif cfg.ranks > 1:
            from torchinferno.engine.assembly import tokenizer_spec
            from torchinferno.parallel.checks import check_spec
            from torchinferno.text.tokenizer import load_tokenizer

            self.spec = self._model_spec()
            check_spec(self.spec, cfg.ranks, "pipeline" if cfg.pipeline_parallel_size > 1 else "tensor")
            self.model, self.vocab = None, None  # the ranks build their shards; vocab from the first engine
            ckpt = None if self.spec.model_kind else self.spec.checkpoint_dir()
            self.tokenizer = load_tokenizer(tokenizer_spec(self.spec, None, ckpt))
        else:
            from torchinferno.engine.assembly import build_model, tokenizer_spec
            from torchinferno.text.tokenizer import load_tokenizer

            spec = self._model_spec()
            self.model = build_model(spec)
            self.tokenizer = load_tokenizer(tokenizer_spec(spec, None, getattr(self.model, "checkpoint_dir", None)))
            self.vocab = min(self.model.config.vocab_size, 10000)
            self.max_model_len = min(self.max_model_len, self.model.config.max_position_embeddings)

    def _model_spec(self):
        """--model-kind (a tiny random model) unless --model names a checkpoint (default: the zoo's default)."""
        from torchinferno.engine.assembly import DEFAULT_MODEL, ModelSpec

        cfg = self.cfg
        if cfg.model_kind and not cfg.model:
            return ModelSpec(model_kind=cfg.model_kind, dtype=cfg.dtype, device=cfg.device)
        return ModelSpec(model=cfg.model or DEFAULT_MODEL, dtype=cfg.dtype, device=cfg.device)

    def engine(self):
        n = max(self.cfg.concurrency, 1)
        if self.model is None and self.spec is None:
            return SyntheticEngine(self.cfg.cost, max_num_seqs=n, max_model_len=self.max_model_len)
        from torchinferno.engine.config import EngineConfig
        from torchinferno.engine.llm_engine import LLMEngine

        config = EngineConfig(max_model_len=self.max_model_len, max_num_seqs=n, max_num_batched_tokens=max(512, n * 8),
                              tensor_parallel_size=self.cfg.tensor_parallel_size,
                              pipeline_parallel_size=self.cfg.pipeline_parallel_size)
        if self.spec is None:
            return LLMEngine(self.model, self.tokenizer, config)
        eng = LLMEngine.from_spec(self.spec, self.tokenizer, config)
        self.parallel_engines.append(eng)
        if self.vocab is None:
            self.vocab = min(eng.vocab_size, 10000)
        return eng

    def close(self) -> None:
        """Stop every spawned worker rank."""
        for eng in self.parallel_engines:
            eng.executor.shutdown()
        self.parallel_engines.clear()


class _Phases:
    """Accumulated seconds per engine phase (wrapping instance methods; the engine code is untouched)."""

    def __init__(self, engine):
        self.engine = engine
        self.acc = {"step": 0.0, "schedule": 0.0, "execute": 0.0, "update": 0.0}
        if isinstance(engine, SyntheticEngine):
            self._wrap(engine, "step", "step")
        else:
            self._wrap(engine, "step", "step")
            self._wrap(engine.scheduler, "schedule", "schedule")
            self._wrap(engine.runner, "execute", "execute")
            self._wrap(engine.scheduler, "update_from_output", "update")

    def _wrap(self, obj, attr: str, key: str) -> None:
        fn = getattr(obj, attr)
        acc = self.acc

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[key] += time.perf_counter() - t

        setattr(obj, attr, timed)

    def report(self, wall_s: float, tokens: int) -> dict:
        a = dict(self.acc)
        if isinstance(self.engine, SyntheticEngine):
            a["schedule"] = self.engine.phase_seconds["schedule"]
            a["execute"] = self.engine.phase_seconds["execute"]
            a["update"] = self.engine.phase_seconds["emit"]
        post = max(0.0, a["step"] - a["schedule"] - a["execute"] - a["update"])
        outside = max(0.0, wall_s - a["step"])
        non_forward = max(0.0, wall_s - a["execute"])
        return {
            "wall_s": round(wall_s, 6), "engine_step_s": round(a["step"], 6), "schedule_s": round(a["schedule"], 6),
            "forward_s": round(a["execute"], 6), "update_s": round(a["update"], 6), "postprocess_s": round(post, 6),
            "outside_step_s": round(outside, 6),
            "non_forward_us_per_token": round(1e6 * non_forward / max(tokens, 1), 1),
        }


# ------------------------------------------------------------------------------ helpers
def _prompts(cfg: MicrobenchConfig, vocab: int, n: int) -> list[list[int]]:
    rng = random.Random(cfg.seed)
    first = [rng.randrange(32, vocab) for _ in range(cfg.prompt_tokens)]
    if cfg.prompt_mode == "self-consistency":
        return [first] * n
    return [first] + [[rng.randrange(32, vocab) for _ in range(cfg.prompt_tokens)] for _ in range(n - 1)]


def _params(cfg: MicrobenchConfig) -> SamplingParams:
    return SamplingParams(max_tokens=cfg.max_tokens, temperature=0.0, ignore_eos=True)


def _summarize(case: str, conc: int, wall: float, ttfts: list[float], e2es: list[float], ntoks: list[int], engine,
               phases: _Phases | None, profile: dict | None) -> CaseResult:
    import numpy as np

    tpots = [(e - t) / (n - 1) for t, e, n in zip(ttfts, e2es, ntoks) if n > 1]
    st = engine.stats()
    tokens = sum(ntoks)
    return CaseResult(
        case=case, requests=len(e2es), concurrency=conc, wall_s=wall, output_tokens=tokens,
        ttft_ms=1000 * statistics.fmean(ttfts) if ttfts else 0.0,
        p99_ttft_ms=1000 * float(np.percentile(ttfts, 99)) if ttfts else 0.0,
        tpot_ms=1000 * statistics.fmean(tpots) if tpots else 0.0, e2e_ms=1000 * statistics.fmean(e2es) if e2es else 0.0,
        output_tok_s=tokens / wall if wall > 0 else 0.0, forward_calls=st.num_forward_calls, max_batch=st.max_batch_seqs,
        phases=phases.report(wall, tokens) if phases else None, profile=profile)


@contextmanager
def _maybe_profile(enabled: bool):
    if not enabled:
        yield None
        return
    from torchinferno.bench.thread_sampler import ThreadSampler

    with ThreadSampler() as s:
        yield s


@contextmanager
def in_thread_server(app, port: int | None = None):
    """Serve ``app`` with uvicorn on 127.0.0.1 in a daemon thread; yields the base URL."""
    import uvicorn

    from torchinferno.bench.local_server import free_port

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=server.run, name="http-server", daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not th.is_alive():
            raise ConfigError("the in-process HTTP server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        th.join(10)


# ------------------------------------------------------------------------------ cases
def _case_direct(cfg: MicrobenchConfig, be: _Backend) -> CaseResult:
    eng = be.engine()
    ph = _Phases(eng) if cfg.phase_timings else None
    prompts = _prompts(cfg, be.vocab, cfg.single_requests)
    ttfts, e2es, ntoks = [], [], []
    with _maybe_profile(cfg.profile_breakdown) as prof:
        t_all = time.perf_counter()
        for i, p in enumerate(prompts):
            t0 = time.perf_counter()
            eng.add_request(f"direct-{i}", p, _params(cfg))
            first, n = None, 0
            while eng.has_unfinished():
                for o in eng.step():
                    if o.new_token_ids and first is None:
                        first = time.perf_counter()
                    n = len(o.token_ids)
            ttfts.append((first or time.perf_counter()) - t0)
            e2es.append(time.perf_counter() - t0)
            ntoks.append(n)
        wall = time.perf_counter() - t_all
    return _summarize("direct", 1, wall, ttfts, e2es, ntoks, eng, ph, prof.report() if prof else None)


def _case_batcher(cfg: MicrobenchConfig, be: _Backend, concurrent: bool) -> CaseResult:
    from torchinferno.engine.async_engine import AsyncEngine

    eng = be.engine()
    ph = _Phases(eng) if cfg.phase_timings else None
    n = cfg.concurrency if concurrent else cfg.single_requests
    prompts = _prompts(cfg, be.vocab, n)

    async def one(ae, i: int, p: list[int]):
        t0 = time.perf_counter()
        first, k = None, 0
        async for o in ae.generate(f"b-{i}", p, _params(cfg)):
            if o.new_token_ids and first is None:
                first = time.perf_counter()
            k = len(o.token_ids)
        return (first or time.perf_counter()) - t0, time.perf_counter() - t0, k

    async def main(ae):
        if concurrent:
            return await asyncio.gather(*(one(ae, i, p) for i, p in enumerate(prompts)))
        return [await one(ae, i, p) for i, p in enumerate(prompts)]

    ae = AsyncEngine(eng, idle_poll_s=0.05)
    try:
        with _maybe_profile(cfg.profile_breakdown) as prof:
            t0 = time.perf_counter()
            res = asyncio.run(main(ae))
            wall = time.perf_counter() - t0
    finally:
        ae.shutdown()
    ttfts, e2es, ntoks = zip(*res)
    name = "batcher-concurrent" if concurrent else "batcher"
    return _summarize(name, n if concurrent else 1, wall, list(ttfts), list(e2es), list(ntoks), eng, ph,
                      prof.report() if prof else None)


def _case_http(cfg: MicrobenchConfig, be: _Backend) -> CaseResult:
    from torchinferno.bench.serve_client import ServeBenchConfig, run_serve_bench
    from torchinferno.engine.async_engine import AsyncEngine
    from torchinferno.server.app import ServerConfig, create_app

    eng = be.engine()
    ph = _Phases(eng) if cfg.phase_timings else None
    ae = AsyncEngine(eng, idle_poll_s=0.05)
    app = create_app(ae, be.tokenizer, ServerConfig("microbench", cfg.backend, be.max_model_len))
    try:
        with in_thread_server(app) as url:
            scfg = ServeBenchConfig(base_url=url, num_prompts=cfg.concurrency, input_len=cfg.prompt_tokens,
                                    output_len=cfg.max_tokens, ignore_eos=True, disable_tqdm=True, seed=cfg.seed,
                                    prompt_format="tokens", same_prompt=cfg.prompt_mode == "self-consistency")
            base_calls = eng.stats().num_forward_calls  # /tokenize for prompts runs no forward; stays 0
            with _maybe_profile(cfg.profile_breakdown) as prof:
                r = run_serve_bench(scfg, log=lambda *_: None)
    finally:
        ae.shutdown()
    ok = [i for i, e in enumerate(r["errors"]) if not e]
    if len(ok) != cfg.concurrency:
        raise ConfigError(f"concurrent case: {cfg.concurrency - len(ok)} request(s) failed: "
                          f"{next(e for e in r['errors'] if e)}")
    res = _summarize("concurrent", cfg.concurrency, r["duration"], [r["ttfts"][i] for i in ok],
                     [r["latencies"][i] for i in ok], [r["output_lens"][i] for i in ok], eng, ph,
                     prof.report() if prof else None)
    res.forward_calls -= base_calls
    return res


def run_microbench(cfg: MicrobenchConfig, log=print) -> dict:
    cfg.validate()
    be = _Backend(cfg)
    try:
        cases = [_case_direct(cfg, be)]
        log(format_cases(cases[-1:], header=True))
        if cfg.compare_batcher:
            cases.append(_case_batcher(cfg, be, concurrent=False))
            log(format_cases(cases[-1:]))
            cases.append(_case_batcher(cfg, be, concurrent=True))
            log(format_cases(cases[-1:]))
        cases.append(_case_http(cfg, be))
        log(format_cases(cases[-1:]))
    finally:
        be.close()
    out = {"config": {**asdict(cfg), "cost": asdict(cfg.cost)}, "cases": [asdict(c) for c in cases]}
    by = {c.case: c for c in cases}
    if "batcher" in by:
        d, b = by["direct"], by["batcher"]
        out["batcher_overhead_ms_per_token"] = round((b.tpot_ms - d.tpot_ms), 4)
        out["batcher_overhead_ttft_ms"] = round((b.ttft_ms - d.ttft_ms), 4)
    return out


def format_cases(cases: list[CaseResult], header: bool = False) -> str:
    lines = []
    if header:
        lines.append(f"{'case':<19}{'reqs':>5}{'conc':>5}{'TTFT ms':>10}{'p99 TTFT':>10}{'TPOT ms':>9}{'e2e ms':>10}"
                     f"{'out tok/s':>11}{'fwd calls':>10}{'max batch':>10}")
    for c in cases:
        lines.append(f"{c.case:<19}{c.requests:>5}{c.concurrency:>5}{c.ttft_ms:>10.2f}{c.p99_ttft_ms:>10.2f}"
                     f"{c.tpot_ms:>9.3f}{c.e2e_ms:>10.1f}{c.output_tok_s:>11.1f}{c.forward_calls:>10}{c.max_batch:>10}")
        if c.phases:
            p = c.phases
            lines.append(f"{'':<5}phases: forward {p['forward_s'] * 1e3:.1f} ms, schedule {p['schedule_s'] * 1e3:.1f} ms, "
                         f"update {p['update_s'] * 1e3:.1f} ms, postprocess {p['postprocess_s'] * 1e3:.1f} ms, outside step "
                         f"{p['outside_step_s'] * 1e3:.1f} ms of {p['wall_s'] * 1e3:.1f} ms wall; "
                         f"non-forward {p['non_forward_us_per_token']:.0f} us/token")
        if c.profile:
            for th, cats in c.profile.items():
                if th == "thread-sampler":
                    continue
                lines.append(f"{'':<5}profile [{th}]: " + ", ".join(f"{k} {v:.0f}%" for k, v in cats.items()))
    return "\n".join(lines)
