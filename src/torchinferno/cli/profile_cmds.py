"""Offline profiling / graph / promotion commands (thin: every command calls ``torchinferno.workbench``).

``profile-run``, ``profile-nodes``, ``profile-subgraph``, ``profile-region``, ``profile-pattern``,
``trace-smoke``, ``candidate``, ``promote``, ``model-variants``, ``research-smoke``; the Helion
commands (``helion-candidate``, ``helion-search-fx``, ``helion-search-region``) live in
``cli/helion_cmds.py`` and are registered from here.
"""

from __future__ import annotations

import argparse
import json

from torchinferno.cli.common import DEFAULT_MODEL_KIND


def _run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model-kind", default=None,
                   help=f"family of a tiny random model (dsv4, deepseek, llama3; default {DEFAULT_MODEL_KIND} when no --model)")
    g.add_argument("--model", default=None, help="checkpoint: registry name, HF dir, .gguf or hub id")
    p.add_argument("--size", default="debug", help="named size of --model-kind (default: debug)")
    p.add_argument("--variant", default=None, help="model variant (default: the family's default)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cpu, or the source run's device)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--prompt-tokens", "--tokens", dest="prompt_tokens", type=int, default=8,
                   help="prompt length per row (--tokens is the same flag)")
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--cache-backend", default="dense", choices=["dense", "paged"])
    p.add_argument("--seed", type=int, default=0)


def _source_or_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source-run", default=None,
                   help=f"a profile-run directory to re-trace (else model flags; default a tiny {DEFAULT_MODEL_KIND})")
    _run_args(p)
    p.add_argument("--iters", type=int, default=20)


def _run_config(a):
    """The RunConfig of model flags; a tiny ``DEFAULT_MODEL_KIND`` model when neither --model-kind nor --model."""
    from torchinferno.workbench.run_config import RunConfig

    if not (a.model_kind or a.model):
        a.model_kind = DEFAULT_MODEL_KIND
    if a.device is None:
        a.device = "cpu"
    return RunConfig.from_args(a)


def _config(a):
    """None for --source-run (re-trace that run), else the model flags' RunConfig (default: tiny DSv4)."""
    from torchinferno.cli.common import check_device
    from torchinferno.errors import ConfigError

    if a.source_run is not None:
        if a.model_kind or a.model:
            raise ConfigError("give either --source-run or --model-kind/--model, not both")
        if a.device is not None:
            check_device(a.device)
        return None
    return _run_config(a)


def _done(manifest: dict, out: str) -> int:
    print(json.dumps(manifest["summary"], default=str))
    print(f"wrote {len(manifest['artifacts'])} artifacts + manifest.json to {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile-run", help="generate under torch.profiler, capture the graph, write a repro")
    p.add_argument("dir")
    _run_args(p)
    p.add_argument("--no-graph", action="store_true", help="skip the make_fx graph capture")
    p.set_defaults(func=cmd_profile_run)

    p = sub.add_parser("profile-nodes", help="list the graph nodes of a profile-run (stable ids)")
    p.add_argument("dir")
    p.add_argument("--grep", default=None, help="case-insensitive substring filter on the node line")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profile_nodes)

    p = sub.add_parser("profile-subgraph", help="cut a node-id slice of a run's graph into a standalone graph")
    p.add_argument("out")
    p.add_argument("--source-run", required=True)
    p.add_argument("--nodes", nargs="+", required=True, help="42:50 (inclusive) | 42,43 | 42 43")
    p.add_argument("--device", default=None, help="re-trace on another device (ids then follow that trace)")
    p.add_argument("--iters", type=int, default=20)
    p.set_defaults(func=cmd_profile_subgraph)

    p = sub.add_parser("profile-region", help="profile one module (layers.0.attn, layers.1.moe, forward, a module path)")
    p.add_argument("out")
    p.add_argument("--region", required=True,
                   help="forward | attention | layers.N[.attn|.mlp|.moe] | a module path such as model.layers.0.self_attn")
    _source_or_model(p)
    p.set_defaults(func=cmd_profile_region)

    p = sub.add_parser("profile-pattern", help="reference vs pattern-replaced graph (comparison.json)")
    p.add_argument("out")
    p.add_argument("--pattern", default="fused-rmsnorm-swiglu", help="fused-rmsnorm-swiglu (default) | swiglu | rms-norm")
    p.add_argument("--hidden-size", type=int, default=None,
                   help="profile the pattern standalone at [--tokens, H] (no model; the README's GPU form)")
    p.add_argument("--intermediate-size", type=int, default=None, help="with --hidden-size: I of the gate/up projection (default H)")
    _source_or_model(p)
    p.set_defaults(func=cmd_profile_pattern)

    p = sub.add_parser("profile-timeslice",
                       help="measure a representative workload, replay it on N time-sliced virtual GPUs sharing one device")
    p.add_argument("dir")
    _run_args(p)
    p.add_argument("--virtual-gpus", type=int, default=8)
    p.add_argument("--time-slice-us", type=float, default=1000.0, help="quantum of device time per slice")
    p.add_argument("--context-switch-us", type=float, default=25.0, help="cost of switching the device between ranks")
    p.add_argument("--profile-scale", type=float, default=1.0,
                   help="inflate the measured workload to a larger target shape (x this factor)")
    p.add_argument("--rank-work-scale", type=float, nargs="*", default=None, metavar="S",
                   help="per-rank multipliers of the work (one per virtual GPU; default all 1)")
    p.add_argument("--iters", type=int, default=3, help="timed runs of the workload (median)")
    p.set_defaults(func=cmd_profile_timeslice)

    p = sub.add_parser("profile-offload",
                       help="decoder-layer weights in host memory, staged to the device per use; movement vs compute")
    p.add_argument("dir")
    _run_args(p)
    p.add_argument("--checkpoint", dest="model", default=None, help="same as --model (the original's spelling)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--activation-offload", action="store_true",
                   help="also move each layer's output to host memory and back")
    p.set_defaults(func=cmd_profile_offload)

    p = sub.add_parser("trace-smoke", help="trace a tiny model's prefill with make_fx (default DSv4) and check it")
    p.add_argument("--model-kind", default=DEFAULT_MODEL_KIND, help=f"family of the tiny model (default: {DEFAULT_MODEL_KIND})")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--fake", action="store_true", help="trace with FakeTensors (no compute)")
    p.add_argument("--print-graph", action="store_true")
    p.add_argument("--tokens", type=int, default=8)
    p.set_defaults(func=cmd_trace_smoke)

    p = sub.add_parser("candidate", help="build, validate and benchmark a replacement for a partition")
    p.add_argument("out")
    p.add_argument("--provider", required=True, help="custom-op | torch-rewrite | torch-compile | triton | helion")
    p.add_argument("--pattern", default=None, help="partition = every site of this pattern (default: whole forward)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend for --provider torch-compile")
    p.add_argument("--tolerance", type=float, default=None)
    _source_or_model(p)
    p.set_defaults(func=cmd_candidate)

    p = sub.add_parser("promote", help="promote a candidate to a named variant (only if correct and faster)")
    p.add_argument("candidate_dir")
    p.add_argument("--name", default=None)
    p.add_argument("--threshold", type=float, default=0.05, help="required speedup over the best baseline minus 1")
    p.add_argument("--parent", default=None)
    p.add_argument("--registry", default=None, help="promoted-variant JSON (default: <cache dir>/promoted_variants.json)")
    p.set_defaults(func=cmd_promote)

    if "model-variants" not in sub.choices:  # another command group may own it; promoted rows come from workbench
        p = sub.add_parser("model-variants", help="list model variants (built-in + promoted) or one lineage")
        p.add_argument("--family", default=None, help="one family (default: every registered family)")
        p.add_argument("--lineage", default=None, metavar="V", help="print the chain V -> parent -> ... -> v0")
        p.add_argument("--registry", default=None, help="promoted-variant JSON (default: <cache dir>/promoted_variants.json)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_model_variants)

    from torchinferno.cli import helion_cmds  # helion-candidate / helion-search-fx / helion-search-region

    helion_cmds.register(sub)

    p = sub.add_parser("research-smoke", help="run the registered research experiments and compare them")
    p.add_argument("--model-kind", default="llama3")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--with-compile", action="store_true", help="add a torch.compile (eager backend) experiment")
    p.add_argument("--no-policies", action="store_true",
                   help="skip the routing / scheduling / prefix-cache policy experiments (workbench.policy_research)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_research_smoke)


def cmd_profile_run(a) -> int:
    from torchinferno.workbench.profile_run import profile_run

    return _done(profile_run(a.dir, _run_config(a), trace_graph=not a.no_graph), a.dir)


def cmd_profile_timeslice(a) -> int:
    from torchinferno.workbench.timeslice import TimesliceConfig, profile_timeslice

    cfg = _run_config(a)
    ts = TimesliceConfig(a.virtual_gpus, a.time_slice_us, a.context_switch_us, a.profile_scale,
                         tuple(a.rank_work_scale or ()))
    return _done(profile_timeslice(a.dir, cfg, ts, iters=a.iters), a.dir)


def cmd_profile_offload(a) -> int:
    from torchinferno.workbench.offload import OffloadConfig, profile_offload

    cfg = _run_config(a)
    return _done(profile_offload(a.dir, cfg, OffloadConfig(a.warmup, a.iters, a.activation_offload)), a.dir)


def cmd_profile_nodes(a) -> int:
    from pathlib import Path

    from torchinferno.errors import ConfigError
    from torchinferno.graph.node_table import format_record
    from torchinferno.workbench.artifacts import read_json

    path = Path(a.dir) / "graph.json"
    if not path.exists():
        raise ConfigError(f"{path} not found: run `torchinferno profile-run {a.dir} ...` (without --no-graph) first")
    nodes = read_json(path)["nodes"]
    if a.grep:
        needle = a.grep.lower()
        nodes = [r for r in nodes if needle in format_record(r).lower()]
    if a.json:
        print(json.dumps(nodes))
    else:
        for r in nodes:
            print(format_record(r))
    return 0


def cmd_profile_subgraph(a) -> int:
    from torchinferno.workbench.subgraph_run import profile_subgraph

    return _done(profile_subgraph(a.out, a.source_run, a.nodes, device=a.device, iters=a.iters), a.out)


def cmd_profile_region(a) -> int:
    from torchinferno.workbench.region_run import profile_region

    cfg = _config(a)
    return _done(profile_region(a.out, a.region, a.source_run, cfg, iters=a.iters, device=a.device if cfg is None else None), a.out)


def cmd_profile_pattern(a) -> int:
    from torchinferno.workbench.pattern_run import profile_pattern

    if a.hidden_size is not None:
        from torchinferno.errors import ConfigError
        from torchinferno.workbench.pattern_block import PatternShape

        if a.source_run or a.model_kind or a.model:
            raise ConfigError("--hidden-size profiles the pattern standalone; do not combine it with --source-run/--model-kind/--model")
        shape = PatternShape(hidden_size=a.hidden_size, tokens=a.prompt_tokens, intermediate_size=a.intermediate_size,
                             dtype=a.dtype, device=a.device or "cpu", seed=a.seed)
        return _done(profile_pattern(a.out, a.pattern, iters=a.iters, shape=shape), a.out)
    cfg = _config(a)
    return _done(profile_pattern(a.out, a.pattern, a.source_run, cfg, iters=a.iters, device=a.device if cfg is None else None),
                 a.out)


def cmd_trace_smoke(a) -> int:
    import time

    import torch

    from torchinferno.cli.common import check_device
    from torchinferno.errors import ConfigError
    from torchinferno.graph.capture import module_path, op_histogram
    from torchinferno.graph.model_forward import prefill_forward, trace_prefill
    from torchinferno.testing import tiny_model

    check_device(a.device)
    if a.tokens < 1:
        raise ConfigError(f"--tokens must be >= 1, got {a.tokens}")
    model = tiny_model(a.model_kind, device=a.device)
    prompts = [[(7 * i + 3) % model.config.vocab_size for i in range(a.tokens)]]
    t0 = time.perf_counter()
    gm, inputs = trace_prefill(model, prompts, fake=a.fake)
    secs = time.perf_counter() - t0
    attn = "model.layers.0.self_attn"
    out = {"family": model.family.name, "device": a.device, "mode": "fake" if a.fake else "real", "tokens": a.tokens,
           "nodes": len(gm.graph.nodes), "trace_s": round(secs, 3),
           "attention_nodes": sum(1 for n in gm.graph.nodes if n.op == "call_function"
                                  and (module_path(n) + ".").startswith(attn + ".")),
           "top_ops": dict(sorted(op_histogram(gm).items(), key=lambda kv: -kv[1])[:6])}
    if not a.fake:
        with torch.no_grad():
            out["max_abs_diff_vs_eager"] = float((gm(*inputs.args) - prefill_forward(model, inputs)(*inputs.args)).abs().max())
    if a.print_graph:
        print(gm.print_readable(print_output=False))
    print(json.dumps(out))
    return 0


def cmd_candidate(a) -> int:
    from torchinferno.workbench.candidates import run_candidate

    m = run_candidate(a.out, a.provider, a.pattern, a.source_run, _config(a), backend=a.backend, iters=a.iters,
                      tolerance=a.tolerance)
    return _done(m, a.out)


def cmd_promote(a) -> int:
    from torchinferno.workbench.promotion import promote

    r = promote(a.candidate_dir, a.name, a.threshold, a.registry, a.parent)
    print(f"promoted {r['family']}:{r['name']} (parent/fallback {r['parent']}, ops {r['ops_module']}): {r['notes']}")
    return 0


def cmd_model_variants(a) -> int:
    from torchinferno.workbench.promotion import lineages, variant_rows

    if a.lineage:
        chains = lineages(a.lineage, a.family, a.registry)
        if a.json:
            print(json.dumps(chains))
        else:
            for fam, chain in chains.items():
                print(f"{fam}: {' -> '.join(chain)}")
        return 0
    rows = variant_rows(a.family, a.registry)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ["family", "variant", "parent", "status", "default", "ops_module", "notes"]
    cells = [[("*" if r[c] else "") if c == "default" else str("" if r.get(c) is None else r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return 0


def cmd_research_smoke(a) -> int:
    from torchinferno.workbench.research import ResearchHarness, smoke_harness

    results = smoke_harness(a.model_kind, a.tokens, a.iters, a.with_compile).run()
    if not a.no_policies:
        from torchinferno.workbench.policy_research import policy_smoke_harness

        results += policy_smoke_harness().run()
    if a.json:
        print(json.dumps([r.to_dict() for r in results], default=str))
    else:
        print(ResearchHarness.table(results))
    return 0 if all(r.error is None for r in results) else 1
