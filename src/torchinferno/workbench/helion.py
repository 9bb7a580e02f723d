"""Helion as one optional provider: ``helion-candidate``, ``helion-search-fx``, ``helion-search-region``.

All three find FX windows (``fx_windows``) that a Helion template can replace and send each
through the same path as every provider: ``candidates.evaluate_graph_candidate`` (the window's
torch graph is the reference; baselines are that graph and the ``custom-op`` graph) and
``promotion.gate`` (correct, and faster than the best baseline by ``threshold``). Each verdict is
a decision record (``decisions``); ``--remember FILE`` appends one JSON line per new decision
and reuses a remembered one for the same question instead of re-tuning (``--refresh`` re-runs).

* ``helion_candidate``: the ``--candidate``'s own reference graph at a shape (one window);
* ``helion_search_fx``: windows of <= ``max_nodes`` compute nodes in the candidate's graph, or in
  a profile-run's graph (``--source-run``, optionally limited to ``--nodes``);
* ``helion_search_region``: windows inside one region of a tiny model traced on ``trace_device``
  (real or fake tensors: discovery only needs shapes), measured on ``device``.

Helion is optional: without it (or without CUDA) the commands raise one ``ConfigError``
(``HELION_MISSING``) before any work; ``list_only`` (``--list-windows``) searches without it.
Helion is imported only inside ``kernels/helion_ops.py`` and only when a candidate is built.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from torchinferno.errors import ConfigError
from torchinferno.workbench.candidates import HELION_MISSING, helion_available  # noqa: F401  (re-exported)

def helion_version() -> str | None:
    if not helion_available():
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("helion")
    except PackageNotFoundError:
        return "unknown"


def require_helion(device: str) -> None:
    """One ``ConfigError`` line unless Helion is installed and ``device`` is an available CUDA device."""
    from torchinferno.cli.common import check_device

    if not helion_available():
        raise ConfigError(HELION_MISSING)
    if not device.startswith("cuda"):
        raise ConfigError(f"Helion kernels run on CUDA: give --device cuda (got {device}; valid: cuda, cuda:N)")
    check_device(device)


@dataclass
class SearchOptions:
    device: str = "cuda"
    max_nodes: int = 5
    iters: int = 20
    threshold: float = 0.05
    tolerance: float | None = None  # default: by dtype (subgraph_run.tolerance_for)
    autotune_effort: str = "quick"  # helion's preset: none | quick | full
    remember: str | None = None  # decisions JSONL
    refresh: bool = False  # re-evaluate remembered questions
    seed: int = 0
    list_only: bool = False  # report windows, evaluate nothing (no Helion needed)
    provider: str = "helion"  # the candidates.py provider evaluated (tests use a torch one on CPU)


def _device_name(device: str) -> str:
    import platform

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or "cpu"


def _helion_kernel_reports(cand, inputs, effort: str) -> list[dict]:
    """Config + generated Triton code of every Helion kernel the candidate graph called."""
    from torch import fx

    from torchinferno.kernels import helion_ops
    from torchinferno.workbench.helion_templates import HELION_OPS

    calls: list[tuple[str, tuple]] = []

    class _Record(fx.Interpreter):
        def call_function(self, target, args, kwargs):
            name = getattr(target, "__name__", "")
            if name in HELION_OPS:
                calls.append((name, args))
            return super().call_function(target, args, kwargs)

    with torch.no_grad():
        _Record(cand).run(*inputs)
    reports = []
    for name, args in calls:
        if name == "helion_fused_rmsnorm_swiglu":  # the fused callable's own kernels: norm of x + residual, then SwiGLU
            x, residual, w, gu_w, eps = args
            h = x + residual
            pairs = [("rms_norm", (h, w, eps)),
                     ("swiglu_activation", (torch.nn.functional.linear(helion_ops.rms_norm_op(h, w, eps, effort), gu_w),))]
        else:
            pairs = [(HELION_OPS[name][0], args)]
        for op, op_args in pairs:
            try:
                reports.append(helion_ops.kernel_report(op, effort, *op_args))
            except Exception as e:  # a report is evidence, not the verdict: keep the decision
                reports.append({"kernel": op, "error": f"{type(e).__name__}: {e}"[:300]})
    return reports


def _magnitude(gm, inputs) -> float:
    """max(1, largest |value| the reference window outputs): scales the error tolerance."""
    with torch.no_grad():
        out = gm(*inputs)
    flat = [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]
    return max([1.0] + [float(t.detach().abs().max()) for t in flat if t.numel()])


def evaluate_windows(command: str, source: str, gm, windows, opts: SearchOptions, out=None) -> list[dict]:
    """One decision record per window (remembered ones reused unless ``opts.refresh``)."""
    from torchinferno.workbench.candidates import build_candidate, evaluate_graph_candidate, provider_available
    from torchinferno.workbench.decisions import decision_key, make_record, remember, remembered
    from torchinferno.workbench.fx_windows import window_case
    from torchinferno.workbench.promotion import gate
    from torchinferno.workbench.subgraph_run import tolerance_for

    ok, why = provider_available(opts.provider, opts.device)
    if not ok:
        raise ConfigError(why)
    gm = copy.deepcopy(gm)  # unused tuple unpacks (a LayerNorm's mean / rstd) would make a window leak outputs
    gm.graph.eliminate_dead_code()  # node ids live in meta: unchanged
    gm.recompile()
    store = remembered(opts.remember) if not opts.refresh else {}
    versions = {"torch": torch.__version__, "helion": helion_version()}
    settings = {"autotune_effort": opts.autotune_effort} if opts.provider == "helion" else {}
    decisions = []
    for i, w in enumerate(windows):
        sub, inputs = window_case(gm, w, opts.device, opts.seed)
        base = {"command": command, "provider": opts.provider, "pattern": w.pattern, "source": source, "node_ids": w.node_ids,
                "targets": w.targets, "module": w.module, "inputs": [{"shape": list(t.shape), "dtype": str(t.dtype)} for t in inputs],
                "device": opts.device, "device_name": _device_name(opts.device), "versions": versions, "settings": settings}
        key = decision_key(base)
        if key in store:
            decisions.append({**store[key], "remembered": True})
            continue
        partition = {"kind": "pattern", "pattern": w.pattern}
        tol = (opts.tolerance if opts.tolerance is not None else tolerance_for(inputs[0].dtype)) * _magnitude(sub, inputs)
        custom, _ = build_candidate(sub, partition, "custom-op")
        r = evaluate_graph_candidate(sub, inputs, partition, opts.provider, opts.iters, tol, {"custom-op": custom},
                                     autotune_effort=opts.autotune_effort)
        corr = {"max_abs_error": r["max_abs_error"], "tolerance": tol, "passed": r["passed"],
                "reference": "the window's torch graph on seeded random inputs",
                "tolerance_rule": "base tolerance (--tolerance, else by dtype) x max(1, max |reference output|)"}
        bench = {k: r[k] for k in ("candidate_us", "baselines_us", "best_baseline", "speedup_vs_best_baseline")}
        bench["iters"] = opts.iters
        accepted, reason = gate(corr, bench, opts.threshold)
        details = {k: v for k, v in r["details"].items() if k != "matched_ids"}
        rec = make_record(**base, correctness=corr, benchmark=bench, threshold=opts.threshold, accepted=accepted,
                          reason=reason, provider_details=details)
        if opts.provider == "helion":
            kernels = _helion_kernel_reports(r["candidate"], inputs, opts.autotune_effort)
            for j, k in enumerate(kernels):
                code = k.pop("triton_code", None)
                if code is not None and out is not None:
                    k["file"] = f"helion_{i}_{w.pattern}_{k['kernel']}.py"
                    out.python(k["file"], code, f"Triton code Helion generated for window {w.node_ids} ({k['kernel']})")
            rec["kernels"] = kernels
        if opts.remember:
            remember(opts.remember, rec)
        decisions.append(rec)
    return decisions


def _summary(command: str, source: str, fit, large, decisions: list[dict], opts: SearchOptions) -> dict:
    return {
        "command": command, "source": source, "provider": opts.provider, "device": opts.device, "max_nodes": opts.max_nodes,
        "windows": [w.to_dict() for w in fit], "too_large": [{"pattern": w.pattern, "node_ids": w.node_ids,
                                                             "compute_nodes": w.compute_nodes} for w in large],
        "evaluated": sum(1 for d in decisions if not d.get("remembered")),
        "remembered": sum(1 for d in decisions if d.get("remembered")),
        "accepted": sum(1 for d in decisions if d["accepted"]),
        "decisions": [{"pattern": d["pattern"], "node_ids": d["node_ids"], "accepted": d["accepted"], "reason": d["reason"],
                       "speedup_vs_best_baseline": d["benchmark"]["speedup_vs_best_baseline"],
                       "max_abs_error": d["correctness"]["max_abs_error"], "remembered": bool(d.get("remembered")),
                       "key": d["key"]} for d in decisions],
        "remember": opts.remember,
    }


def _run(command: str, source: str, gm, fit, large, opts: SearchOptions, out_dir: str | Path | None) -> dict:
    from torchinferno.workbench.artifacts import ArtifactDir

    out = ArtifactDir(out_dir, command) if out_dir is not None else None
    decisions = [] if opts.list_only else evaluate_windows(command, source, gm, fit, opts, out)
    summary = _summary(command, source, fit, large, decisions, opts)
    if out is not None:
        out.json("search_report.json", {**summary, "decisions": decisions}, "windows found and every decision with its evidence")
        out.finish(**{k: summary[k] for k in ("source", "evaluated", "remembered", "accepted")})
    return summary


def _precheck(opts: SearchOptions) -> None:
    if opts.list_only:
        return
    if opts.provider == "helion":
        require_helion(opts.device)
    if opts.iters < 1:
        raise ConfigError(f"--iters must be >= 1, got {opts.iters}")


def helion_candidate(shape, opts: SearchOptions, out_dir: str | Path | None = None) -> dict:
    """Evaluate ``shape.candidate``'s reference graph as one window (no size limit)."""
    from torchinferno.workbench.fx_windows import find_windows
    from torchinferno.workbench.helion_templates import candidate_graph

    shape.validate()
    _precheck(opts)
    gm = candidate_graph(shape)
    fit, _ = find_windows(gm, (shape.candidate,), max_nodes=len(gm.graph.nodes))
    source = f"candidate {shape.candidate} rows={shape.rows} hidden={shape.hidden_size} dtype={shape.dtype}"
    return _run("helion-candidate", source, gm, fit, [], opts, out_dir)


def helion_search_fx(opts: SearchOptions, shape=None, source_run: str | Path | None = None, nodes=None,
                     out_dir: str | Path | None = None) -> dict:
    """Windows of <= ``opts.max_nodes`` in the candidate graph (``shape``) or a run's graph (``source_run``)."""
    from torchinferno.workbench.fx_windows import find_windows
    from torchinferno.workbench.helion_templates import TEMPLATE_PATTERNS, candidate_graph

    if (shape is None) == (source_run is None):
        raise ConfigError("give either --candidate (a reference graph at a shape) or --source-run RUN, not both")
    if shape is not None:
        shape.validate()
    _precheck(opts)
    within = None
    if shape is not None:
        gm = candidate_graph(shape)
        source = f"candidate {shape.candidate} rows={shape.rows} hidden={shape.hidden_size} dtype={shape.dtype}"
    else:
        from torchinferno.graph.subgraph import parse_node_selection
        from torchinferno.workbench.graph_artifacts import retrace_run

        gm = retrace_run(source_run).gm
        source = f"run {source_run}"
        if nodes:
            within = set(parse_node_selection(nodes, len(gm.graph.nodes)))
            source += f" nodes {' '.join(nodes) if not isinstance(nodes, str) else nodes}"
    fit, large = find_windows(gm, TEMPLATE_PATTERNS, opts.max_nodes, within)
    return _run("helion-search-fx", source, gm, fit, large, opts, out_dir)


def helion_search_region(cfg, region: str, opts: SearchOptions, fake: bool = False,
                         out_dir: str | Path | None = None) -> dict:
    """Windows inside ``region`` of ``cfg``'s model traced on ``cfg.device``, measured on ``opts.device``."""
    from torchinferno.graph.capture import module_path
    from torchinferno.graph.model_forward import trace_prefill
    from torchinferno.workbench.fx_windows import find_windows
    from torchinferno.workbench.helion_templates import TEMPLATE_PATTERNS
    from torchinferno.workbench.region_names import resolve_region
    from torchinferno.workbench.run_config import build_model, make_prompts

    cfg.validate()
    _precheck(opts)
    model = build_model(cfg)
    path, _ = resolve_region(model, region)
    gm, _ = trace_prefill(model, make_prompts(cfg, model.config.vocab_size), fake=fake)
    within = {n.meta["ti_node_id"] for n in gm.graph.nodes
              if n.op == "call_function" and (path == "" or (module_path(n) + ".").startswith(path + "."))}
    fit, large = find_windows(gm, TEMPLATE_PATTERNS, opts.max_nodes, within)
    source = (f"{cfg.model or cfg.model_kind} region {region} ({path or 'root'}), traced on {cfg.device}"
              f"{' with fake tensors' if fake else ''}, {cfg.batch_size}x{cfg.prompt_tokens} tokens")
    return _run("helion-search-region", source, gm, fit, large, opts, out_dir)
