"""Candidates: one provider's replacement for one partition of a run's graph, validated and timed.

A *partition* is what gets replaced: ``{"kind": "pattern", "pattern": "fused-rmsnorm-swiglu"}``
(every site of a library pattern) or ``{"kind": "forward"}`` (the whole prefill forward). A
*provider* produces the replacement:

* ``custom-op``     -- the pattern's sites become ``torch.ops.torchinferno`` custom ops;
* ``torch-rewrite`` -- the same sites become plain torch reference code (no custom op);
* ``torch-compile`` -- ``torch.compile`` of the graph (scope: the whole graph; ``--backend``);
* ``helion``        -- the pattern's sites become the custom ops, whose calls are then pointed at
  Helion kernels (``kernels/helion_ops.py`` via ``helion_templates.helion_replacements``); needs
  Helion and CUDA (a one-line error otherwise);
* ``triton``        -- not a provider of its own yet (the custom ops already dispatch to Triton on CUDA).

``evaluate_graph_candidate`` is the one measurement every provider's candidate goes through
(correctness vs the reference graph, median times vs every baseline, speedup vs the best);
``promotion.gate`` turns its result into the accept/reject verdict.

What a candidate becomes at runtime (``runtime_form``; ``promotion.promote`` stores it): runtime
never traces or compiles (SPEC section 0), so only providers with a runtime ops module are
promotable. ``custom-op`` -> ``models/<family>/custom_ops_ops.py`` (RMSNorm / SwiGLU through the
``torch.ops.torchinferno`` custom ops), ``torch-rewrite`` -> ``models/<family>/torch_rewrite_ops.py``
(the same sites as ``kernels/reference.py`` torch code). ``torch-compile`` candidates are refused
at promotion (an offline-compiled artifact, e.g. AOTInductor, is not supported yet), as is any
partition without a runtime ops module.

``run_candidate`` writes ``partition.json``, ``provider.json``, ``correctness.json`` (max abs
error vs the reference graph on the run's inputs, tolerance, passed), ``benchmark.json``
(median us of the candidate and of every baseline: the reference ATen graph and the eager
forward; speedup vs the best baseline) and ``repro.py``. ``promotion.promote`` reads them.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Callable

import torch

from torchinferno.errors import ConfigError
from torchinferno.workbench.artifacts import ArtifactDir

PROVIDERS = ("custom-op", "torch-rewrite", "torch-compile", "triton", "helion")
HELION_MISSING = "Helion is not installed (pip install helion; needs CUDA)"


def helion_available() -> bool:
    return importlib.util.find_spec("helion") is not None


def provider_available(name: str, device: str) -> tuple[bool, str]:
    if name not in PROVIDERS:
        raise ConfigError(f"unknown provider '{name}' (valid: {', '.join(PROVIDERS)})")
    if name == "helion":
        if not helion_available():
            return False, HELION_MISSING
        if not device.startswith("cuda"):
            return False, "helion candidates need --device cuda (Helion generates CUDA kernels)"
        return True, ""
    if name == "triton":
        if importlib.util.find_spec(name) is None:
            return False, f"{name} is not installed (pip install {name})"
        if not device.startswith("cuda"):
            return False, f"{name} candidates need --device cuda"
        return False, ("triton is not a separate provider yet: the custom-op provider's ops already run Triton kernels "
                       "on CUDA (use --provider custom-op)")
    return True, ""


# provider -> ops module file under models/<family>/ implementing the family's ops contract
RUNTIME_OPS = {"custom-op": "custom_ops_ops", "torch-rewrite": "torch_rewrite_ops"}
# partitions whose every replaced op has a runtime equivalent in those modules
RUNTIME_PATTERNS = ("fused-rmsnorm-swiglu", "swiglu")


def runtime_form(family: str, provider: str, partition: dict) -> dict:
    """``{"ops_module": ..., "description": ...}``: the buildable runtime form of a candidate, or a
    ``ConfigError`` saying why the candidate cannot be promoted (runtime never compiles)."""
    from torchinferno.models.registry import get_family

    if provider == "torch-compile":
        raise ConfigError("not promoted: torch-compile candidates are not promotable; runtime never compiles "
                          "(SPEC section 0) and offline-compiled artifacts are not supported yet; promote a custom-op or "
                          "torch-rewrite candidate of a pattern instead")
    if provider not in RUNTIME_OPS:
        raise ConfigError(f"not promoted: provider {provider} has no runtime form (promotable: {', '.join(RUNTIME_OPS)})")
    if partition.get("kind") != "pattern" or partition.get("pattern") not in RUNTIME_PATTERNS:
        raise ConfigError(f"not promoted: partition {partition} has no runtime ops module "
                          f"(promotable patterns: {', '.join(RUNTIME_PATTERNS)})")
    fam = get_family(family)
    if not fam.variants_module:
        raise ConfigError(f"not promoted: family {fam.name} has no variant registry")
    module = f"{fam.variants_module.rsplit('.', 1)[0]}.{RUNTIME_OPS[provider]}"
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"not promoted: {fam.name} has no runtime ops module {module} for provider {provider}")
    what = ("RMSNorm / SwiGLU through torch.ops.torchinferno custom ops" if provider == "custom-op"
            else "RMSNorm / SwiGLU as torchinferno.kernels.reference torch code")
    return {"ops_module": module, "description": f"ops module {module}: {what}; other ops as the family's fused_ops"}


def parse_partition(pattern: str | None) -> dict:
    if pattern is None:
        return {"kind": "forward"}
    from torchinferno.graph.patterns import get_pattern

    get_pattern(pattern)
    return {"kind": "pattern", "pattern": pattern}


def build_candidate(gm, partition: dict, provider: str, backend: str = "inductor",
                    autotune_effort: str = "quick") -> tuple[Callable, dict]:
    """(candidate callable over the graph inputs, provider details) for ``partition`` of ``gm``."""
    from torchinferno.graph.passes import replace_call_function_targets
    from torchinferno.graph.patterns import apply_pattern

    if provider in ("custom-op", "torch-rewrite", "helion"):
        if partition["kind"] != "pattern":
            raise ConfigError(f"provider {provider} replaces pattern sites: give --pattern (valid partitions: pattern)")
        new = copy.deepcopy(gm)
        res = apply_pattern(new, partition["pattern"])
        if res["replaced"] == 0:
            raise ConfigError(f"pattern {partition['pattern']} matches nothing in this graph; no candidate to build")
        details = {"replaced": res["replaced"], "matched_ids": [m["matched_ids"] for m in res["matches"]],
                   "op": res["replacement_op"]}
        if provider == "torch-rewrite":
            from torchinferno.kernels import custom_ops

            mapping = {op: ref for op, ref in custom_ops.OPS.values()}
            details["rewired_to_reference"] = replace_call_function_targets(new, mapping)
            details["op"] = "torchinferno.kernels.reference (plain torch)"
        if provider == "helion":
            from torchinferno.workbench.helion_templates import helion_replacements

            details["rewired_to_helion"] = replace_call_function_targets(new, helion_replacements(autotune_effort))
            details["op"] = "torchinferno.kernels.helion_ops (Helion-generated Triton)"
            details["autotune_effort"] = autotune_effort
        return new, details
    if provider == "torch-compile":
        from torchinferno.graph.compile import compile_forward

        exp = compile_forward(gm, backend=backend)
        return exp.compile(), {"backend": backend, "scope": "whole graph (torch.compile sees every node)"}
    raise ConfigError(f"provider {provider} cannot build a candidate here")


def evaluate_graph_candidate(ref, args, partition: dict, provider: str, iters: int, tolerance: float,
                             baselines: dict[str, Callable] | None = None, backend: str = "inductor",
                             autotune_effort: str = "quick") -> dict:
    """Build ``provider``'s candidate for ``partition`` of the graph ``ref``, check and time it.

    Correctness: max abs error of ``candidate(*args)`` vs ``ref(*args)`` against ``tolerance``.
    Speed: median us of the candidate and of every baseline (``ref`` itself as
    ``reference-graph``, plus ``baselines``), speedup vs the fastest baseline. The first
    candidate call happens before any timing (compiles/tunes there, e.g. Helion autotuning).
    """
    from torchinferno.graph.compile import time_callable
    from torchinferno.graph.subgraph import max_abs_diff

    cand, details = build_candidate(ref, partition, provider, backend, autotune_effort)
    with torch.no_grad():
        err = max_abs_diff([cand(*args)], [ref(*args)])
    times = {"reference-graph": time_callable(ref, args, iters)}
    times.update({name: time_callable(fn, args, iters) for name, fn in (baselines or {}).items()})
    cand_us = time_callable(cand, args, iters)
    best = min(times, key=times.get)
    return {"candidate": cand, "details": details, "max_abs_error": err, "tolerance": tolerance, "passed": err <= tolerance,
            "baselines_us": {k: round(v, 3) for k, v in times.items()}, "candidate_us": round(cand_us, 3),
            "best_baseline": best, "speedup_vs_best_baseline": round(times[best] / cand_us, 4) if cand_us > 0 else 0.0}


def _evaluate(run, partition: dict, provider: str, backend: str, iters: int, tolerance: float | None) -> dict:
    from torchinferno.graph.model_forward import prefill_forward
    from torchinferno.workbench.subgraph_run import tolerance_for

    ok, why = provider_available(provider, run.config.device)
    if not ok:
        raise ConfigError(why)
    tol = tolerance if tolerance is not None else tolerance_for(next(run.model.parameters()).dtype)
    return evaluate_graph_candidate(run.gm, run.inputs.args, partition, provider, iters, tol,
                                    {"eager-forward": prefill_forward(run.model, run.inputs)}, backend)


def check_candidate(run_config: dict, input_ids: list[list[int]], partition: dict, provider: str, backend: str,
                    tolerance: float) -> dict:
    """Rebuild the run and re-check the candidate's correctness (what the candidate's ``repro.py`` runs)."""
    from torchinferno.graph.model_forward import trace_prefill
    from torchinferno.workbench.graph_artifacts import TracedRun
    from torchinferno.workbench.run_config import RunConfig, build_model

    cfg = RunConfig.from_dict(run_config)
    model = build_model(cfg)
    gm, inputs = trace_prefill(model, input_ids)
    r = _evaluate(TracedRun(cfg, model, gm, inputs, None), partition, provider, backend, 3, tolerance)
    return {"ok": r["passed"], "max_abs_error": r["max_abs_error"], "tolerance": tolerance,
            "speedup_vs_best_baseline": r["speedup_vs_best_baseline"]}


def run_candidate(out_dir: str | Path, provider: str, pattern: str | None = None, source_run: str | Path | None = None,
                  cfg=None, backend: str = "inductor", iters: int = 20, tolerance: float | None = None) -> dict:
    """Build, validate and benchmark one candidate into ``out_dir``; returns the manifest."""
    from torchinferno.workbench.graph_artifacts import retrace_run, trace_config
    from torchinferno.workbench.repro_templates import call_repro

    partition = parse_partition(pattern)
    provider_available(provider, "cpu")  # unknown provider names raise here
    if provider in ("triton", "helion"):  # missing, or unusable on the given device: fail before any model work
        ok, why = provider_available(provider, cfg.device if cfg is not None else "cuda")
        if not ok:
            raise ConfigError(why)
    run = retrace_run(source_run) if source_run is not None else trace_config(cfg)
    r = _evaluate(run, partition, provider, backend, iters, tolerance)
    out = ArtifactDir(out_dir, "candidate")
    family = getattr(getattr(run.model, "family", None), "name", None)
    out.json("partition.json", {**partition, "family": family, "source_run": str(source_run) if source_run else None,
                                "run_config": run.config.to_dict(), "input_ids": run.inputs.prompts,
                                "sites": r["details"].get("matched_ids")}, "what this candidate replaces")
    out.json("provider.json", {"provider": provider, "backend": backend if provider == "torch-compile" else None,
                               **{k: v for k, v in r["details"].items() if k != "matched_ids"}}, "who produced the replacement")
    out.json("correctness.json", {"max_abs_error": r["max_abs_error"], "tolerance": r["tolerance"], "passed": r["passed"],
                                  "reference": "the run's reference ATen graph on its recorded inputs"},
             "numerics of the candidate vs the reference")
    out.json("benchmark.json", {"candidate_us": r["candidate_us"], "baselines_us": r["baselines_us"],
                                "best_baseline": r["best_baseline"], "speedup_vs_best_baseline": r["speedup_vs_best_baseline"],
                                "iters": iters, "device": run.config.device}, "median times: candidate vs every baseline")
    args = {"run_config": run.config.to_dict(), "input_ids": run.inputs.prompts, "partition": partition,
            "provider": provider, "backend": backend, "tolerance": r["tolerance"]}
    out.python("repro.py", call_repro(f"Candidate {provider} for {partition}", "repro.py", "torchinferno.workbench.candidates",
                                      "check_candidate", args), "re-checks the candidate's correctness from scratch")
    return out.finish(family=family, partition=partition, provider=provider, passed=r["passed"],
                      max_abs_error=r["max_abs_error"], speedup_vs_best_baseline=r["speedup_vs_best_baseline"])
