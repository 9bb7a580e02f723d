"""Data-parallel routing commands (thin: each calls the library): ``router`` (a FastAPI front over remote
OpenAI-compatible workers), ``bench-router`` (cache-aware vs round-robin routing on a shared-system-prompt chat
trace: prefix-cache hit rate and TTFT) and ``research`` (routing / scheduling / prefix-cache policies on a trace)."""

from __future__ import annotations

import argparse
import json
import sys


def _trace_args(p: argparse.ArgumentParser, users: int, turns: int) -> None:
    g = p.add_argument_group("shared-system-prompt chat trace (sim.chat_trace)")
    g.add_argument("--system-prompts", type=int, default=8)
    g.add_argument("--users", type=int, default=users, help=f"conversations per system prompt (default {users})")
    g.add_argument("--turns", type=int, default=turns)
    g.add_argument("--system-len", type=int, default=256, help="system prompt tokens (default 256)")
    g.add_argument("--user-len", default="uniform:16:48", help="user message tokens per turn")
    g.add_argument("--reply-len", default="uniform:16:48", help="reply tokens per turn (= tokens generated)")
    g.add_argument("--rate", type=float, default=8.0, help="new conversations per second (default 8)")
    g.add_argument("--think-s", type=float, default=1.0, help="mean seconds between a conversation's turns (default 1)")
    g.add_argument("--seed", type=int, default=0)


def _engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replicas")
    g.add_argument("--replicas", type=int, default=2, help="data-parallel replicas (default 2)")
    g.add_argument("--num-blocks", type=int, default=96,
                   help="KV blocks per replica (default 96 x 16 tokens: less than the trace's working set, so "
                        "where a prefix lives matters)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--max-num-seqs", type=int, default=16)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=2048)
    g.add_argument("--model-size", default="bench",
                   help="bench (a widened tiny llama3, random weights; default) or a named llama3 size (llama3-8b)")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steps timed by CPU time)")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (live runs on CUDA)")
    g.add_argument("--timer", default=None, choices=["thread", "wall"],
                   help="how a live step is timed: this thread's CPU time (default on CPU) or wall time (default on "
                        "CUDA)")
    g.add_argument("--sim-prefill-us-per-token", type=float, default=30.0)
    g.add_argument("--sim-decode-us-per-token", type=float, default=60.0)
    g.add_argument("--sim-step-ms", type=float, default=7.0,
                   help="the simulator's cost model: c0 + prefill + decode per token (defaults: a rough 8B on one H200)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def register(sub) -> None:
    from torchinferno.engine.route_policy import POLICIES

    p = sub.add_parser("bench-router", help="cache-aware vs round-robin (and least-loaded) routing over data-parallel "
                                            "replicas on a shared-system-prompt chat trace: prefix hit rate, TTFT")
    _trace_args(p, users=64, turns=3)
    _engine_args(p)
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated routing policies")
    p.add_argument("--sim", action="store_true", help="also run every policy in the simulator")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless cache-aware gets >= 1.5x round-robin's prefix hit rate and a lower TTFT p50")
    p.set_defaults(func=cmd_bench_router)

    p = sub.add_parser("research", help="routing, scheduling and prefix-cache policies compared on a trace "
                                        "(live on a model and/or simulated): one table row per policy")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", default=None, help="JSONL: {arrival_s, prompt_token_ids, output_len} per line "
                                                   "(or sim-trace lengths only)")
    src.add_argument("--synthetic", default=None, choices=["shared-system-prompt"])
    _trace_args(p, users=4, turns=2)
    _engine_args(p)
    p.add_argument("--groups", default="route,sched,cache", help="experiment groups: route, sched, cache")
    p.add_argument("--modes", default="live", help="live, sim or live,sim")
    p.set_defaults(func=cmd_research)

    p = sub.add_parser("router", help="an OpenAI-compatible front over several remote OpenAI-compatible servers "
                                      "(serve ...): routing policy, health probes, retry before the first byte")
    p.add_argument("--workers", nargs="+", required=True, metavar="URL", help="worker base URLs (http://host:port)")
    p.add_argument("--router-policy", default="cache-aware", choices=list(POLICIES))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--health-interval", type=float, default=2.0, metavar="S", help="seconds between health probes")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="longest a worker may take between bytes of an answer")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_router)


def _requests(a, vocab: int):
    from torchinferno.sim.chat_trace import (
        ChatTraceSpec,
        load_token_trace,
        shared_system_prompt,
    )

    if getattr(a, "trace", None):
        return load_token_trace(a.trace, vocab, a.seed)
    return shared_system_prompt(ChatTraceSpec(a.system_prompts, a.users, a.turns, a.system_len, a.user_len,
                                              a.reply_len, a.rate, a.think_s, vocab, a.seed))


def _study(a, modes: tuple[str, ...], groups: tuple[str, ...], routing: tuple[str, ...]):
    import torch

    from torchinferno.engine.config import EngineConfig
    from torchinferno.errors import ConfigError
    from torchinferno.sim.cost_model import CostModel
    from torchinferno.sim.policy_bench import bench_model
    from torchinferno.workbench.policy_research import PolicyStudy

    if a.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {a.threads}")
    if a.replicas < 1 or a.num_blocks < 1:
        raise ConfigError("--replicas and --num-blocks must be >= 1")
    torch.set_num_threads(a.threads)
    model = bench_model(a.model_size, a.device, a.dtype, a.max_model_len) if "live" in modes else None
    vocab = model.config.vocab_size if model is not None else 259
    reqs = _requests(a, vocab)
    cfg = EngineConfig(block_size=a.block_size, max_num_seqs=a.max_num_seqs,
                       max_num_batched_tokens=a.max_num_batched_tokens, enforce_eager=a.enforce_eager)  # context: the model's, capped by the pool
    cost = CostModel.per_token(a.sim_prefill_us_per_token * 1e-6, a.sim_decode_us_per_token * 1e-6, a.sim_step_ms * 1e-3)
    timer = a.timer or ("wall" if a.device.startswith("cuda") else "thread")
    return PolicyStudy(reqs, cfg, a.num_blocks, model, cost, a.replicas, modes, groups, routing, timer, a.max_model_len)


def _print(a, results, extra: dict | None = None) -> None:
    from torchinferno.workbench.research import ResearchHarness

    if a.json:
        print(json.dumps({"results": [r.to_dict() for r in results], **(extra or {})}, default=str))
    else:
        print(ResearchHarness.table(results))


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def cmd_bench_router(a) -> int:
    from torchinferno.workbench.policy_research import policy_harness, warm_up

    study = _study(a, ("live", "sim") if a.sim else ("live",), ("route",), _split(a.policies))
    n = len(study.requests)
    print(f"trace: {a.system_prompts} system prompts x {a.users} users x {a.turns} turns = {n} requests; "
          f"{a.replicas} replicas of {a.num_blocks} x {a.block_size}-token KV blocks; model {a.model_size} on "
          f"{a.device}; steps timed by {study.timer} time", file=sys.stderr if a.json else sys.stdout, flush=True)
    warm_up(study)
    results = policy_harness(study).run()
    verdicts = {}
    for mode in study.modes:
        ca, rr = study.raw.get(f"{mode}:route/cache-aware"), study.raw.get(f"{mode}:route/round-robin")
        if ca and rr:
            ratio = ca["prefix_hit_rate"] / rr["prefix_hit_rate"] if rr["prefix_hit_rate"] else float("inf")
            verdicts[mode] = {"hit_rate_ratio": ratio, "ttft_p50_ms": (ca["p50_ttft_s"] * 1e3, rr["p50_ttft_s"] * 1e3),
                              "met": ratio >= 1.5 and ca["p50_ttft_s"] < rr["p50_ttft_s"]}
    _print(a, results, {"verdicts": verdicts})
    if not a.json:
        for mode, v in verdicts.items():
            print(f"{mode}: cache-aware / round-robin prefix hit rate = {v['hit_rate_ratio']:.2f}x (target >= 1.5x); "
                  f"TTFT p50 {v['ttft_p50_ms'][0]:.2f} vs {v['ttft_p50_ms'][1]:.2f} ms "
                  f"({'met' if v['met'] else 'NOT met'})")
    if any(r.error for r in results):
        return 1
    return 1 if a.check and not all(v["met"] for v in verdicts.values()) else 0


def cmd_research(a) -> int:
    from torchinferno.engine.route_policy import POLICIES
    from torchinferno.workbench.policy_research import policy_harness, warm_up

    study = _study(a, _split(a.modes), _split(a.groups), POLICIES)
    print(f"{len(study.requests)} requests ({a.trace or a.synthetic}); {a.replicas} replicas of {a.num_blocks} KV "
          f"blocks", file=sys.stderr if a.json else sys.stdout, flush=True)
    warm_up(study)
    results = policy_harness(study).run()
    _print(a, results)
    return 0 if all(r.error is None for r in results) else 1


def build_router(a):
    """-> (app, config): the router app of ``router``'s flags (also used by tests)."""
    from urllib.parse import urlparse

    from torchinferno.engine.route_policy import make_policy
    from torchinferno.errors import ConfigError
    from torchinferno.server.router_app import RouterConfig, create_router_app

    for u in a.workers:
        parsed = urlparse(u)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"--workers: {u!r} is not an http(s)://host:port URL")
    if a.health_interval <= 0 or a.request_timeout <= 0:
        raise ConfigError("--health-interval and --request-timeout must be > 0")
    cfg = RouterConfig(list(a.workers), health_interval_s=a.health_interval, request_timeout_s=a.request_timeout)
    # bytes, not tokens: about 4 bytes a token, so a 16-token block is 64 bytes
    opts = {"min_match_tokens": 64, "max_tree_tokens": 1 << 24} if a.router_policy == "cache-aware" else {}
    return create_router_app(cfg, make_policy(a.router_policy, len(a.workers), **opts)), cfg


def cmd_router(a) -> int:
    import uvicorn

    app, cfg = build_router(a)
    print(f"routing ({a.router_policy}) over {len(cfg.workers)} workers on http://{a.host}:{a.port}", flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level)
    return 0
