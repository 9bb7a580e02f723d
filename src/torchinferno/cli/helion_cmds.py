"""Helion provider commands (thin: everything is ``torchinferno.workbench.helion``).

``helion-candidate``, ``helion-search-fx``, ``helion-search-region``. Registered from
``profile_cmds.register`` (same command group: offline optimization). Without Helion they print
``error: Helion is not installed (pip install helion; needs CUDA)`` and exit 1, except with
``--list-windows``, which only searches the graph.
"""

from __future__ import annotations

import argparse
import json


def _search_args(p: argparse.ArgumentParser, device_default: str = "cuda") -> None:
    p.add_argument("out", nargs="?", default=None, help="optional artifact directory (search_report.json, generated kernels)")
    p.add_argument("--device", default=device_default, help="where candidates are measured: cuda | cuda:N (default cuda)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per callable (median)")
    p.add_argument("--threshold", type=float, default=0.05, help="required speedup over the best baseline minus 1")
    p.add_argument("--tolerance", type=float, default=None, help="max abs error vs the torch window (default by dtype)")
    p.add_argument("--autotune-effort", default="quick", choices=["none", "quick", "full"],
                   help="Helion autotuning preset (none = its default config, no tuning)")
    p.add_argument("--remember", default=None, metavar="FILE.jsonl",
                   help="append one JSON line per decision; reuse remembered decisions for the same question")
    p.add_argument("--refresh", action="store_true", help="with --remember: re-evaluate questions already decided")
    p.add_argument("--seed", type=int, default=0, help="seed of the random window inputs")
    p.add_argument("--list-windows", action="store_true", help="only list the windows found (needs no Helion, no GPU)")


def _shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--candidate", "--pattern", dest="candidate", default="swiglu",
                   help="swiglu (default) | rms-norm | fused-rmsnorm-swiglu")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--hidden-size", type=int, default=4096)
    p.add_argument("--intermediate-size", type=int, default=None, help="fused-rmsnorm-swiglu: I (default: hidden size)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("helion-candidate", help="check and time a Helion kernel for a candidate at a shape (needs Helion)")
    _shape_args(p)
    _search_args(p)
    p.set_defaults(func=cmd_helion_candidate)

    p = sub.add_parser("helion-search-fx", help="search FX windows of a graph for Helion replacements (needs Helion)")
    _shape_args(p)
    p.add_argument("--source-run", default=None, help="search a profile-run's graph instead of the candidate's")
    p.add_argument("--nodes", nargs="*", default=None, help="with --source-run: only windows inside these node ids")
    p.add_argument("--max-nodes", type=int, default=5, help="largest window, in compute nodes (getitem not counted)")
    _search_args(p)
    p.set_defaults(func=cmd_helion_search_fx)

    p = sub.add_parser("helion-search-region", help="search a model region's FX windows for Helion replacements")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model-kind", default=None, help="family of a tiny random model (default dsv4 when no --model)")
    g.add_argument("--model", default=None, help="checkpoint: registry name, HF dir, .gguf or hub id")
    p.add_argument("--size", default="debug")
    p.add_argument("--region", default="attention", help="attention (default) | forward | layers.N[.attn|.mlp|.moe] | a module path")
    p.add_argument("--trace-device", default="cpu", help="device the discovery trace runs on (default cpu)")
    p.add_argument("--fake", action="store_true", help="trace with FakeTensors (shapes only)")
    p.add_argument("--tokens", type=int, default=8, help="prompt tokens of the traced prefill")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-nodes", type=int, default=5, help="largest window, in compute nodes (getitem not counted)")
    _search_args(p)
    p.set_defaults(func=cmd_helion_search_region)


def _options(a):
    from torchinferno.workbench.helion import SearchOptions

    return SearchOptions(device=a.device, max_nodes=getattr(a, "max_nodes", 5), iters=a.iters, threshold=a.threshold,
                         tolerance=a.tolerance, autotune_effort=a.autotune_effort, remember=a.remember, refresh=a.refresh,
                         seed=a.seed, list_only=a.list_windows)


def _shape(a):
    from torchinferno.workbench.helion_templates import CandidateShape

    return CandidateShape(candidate=a.candidate, batch_size=a.batch_size, tokens=a.tokens, hidden_size=a.hidden_size,
                          intermediate_size=a.intermediate_size, dtype=a.dtype)


def _print(summary: dict) -> int:
    print(json.dumps(summary, default=str))
    return 0


def cmd_helion_candidate(a) -> int:
    from torchinferno.workbench.helion import helion_candidate

    return _print(helion_candidate(_shape(a), _options(a), a.out))


def cmd_helion_search_fx(a) -> int:
    from torchinferno.workbench.helion import helion_search_fx

    shape = None if a.source_run else _shape(a)
    return _print(helion_search_fx(_options(a), shape=shape, source_run=a.source_run, nodes=a.nodes, out_dir=a.out))


def cmd_helion_search_region(a) -> int:
    from torchinferno.cli.common import DEFAULT_MODEL_KIND
    from torchinferno.workbench.helion import helion_search_region
    from torchinferno.workbench.run_config import RunConfig

    cfg = RunConfig(model_kind=a.model_kind or (None if a.model else DEFAULT_MODEL_KIND), model=a.model, size=a.size,
                    device=a.trace_device, dtype=a.dtype, prompt_tokens=a.tokens)
    return _print(helion_search_region(cfg, a.region, _options(a), fake=a.fake, out_dir=a.out))
