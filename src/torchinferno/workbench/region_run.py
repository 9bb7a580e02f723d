"""``profile-region``: profile one module of a model (``layers.0.attn``, ``model.layers.0.self_attn``, ...).

Region names are resolved by ``region_names.resolve_region`` (the README's short names
``forward``, ``layers.N.attn|mlp|moe`` and any module path). The module's real inputs are
captured with a forward hook during one eager prefill forward; the module is then timed and
profiled eagerly on those inputs, traced alone (``region_graph.json|txt|_module.py``), and
located in the run's full graph (``region_spec.json`` lists its node ids there, which is what
``profile-subgraph --nodes`` takes; that slice is also re-run and compared).

Artifacts: ``region_spec.json``, ``region_graph.json``, ``region_graph.txt``,
``region_graph_module.py``, ``operator_profile.json``, ``chrome_trace.json``,
``memory_profile.json``, ``region_tensors.pt`` and ``region_repro.py``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.workbench.artifacts import ArtifactDir
from torchinferno.workbench.region_names import resolve_region


def capture_module_call(model: nn.Module, module: nn.Module, forward, args) -> tuple[tuple, dict, object]:
    """(args, kwargs, output) of ``module``'s first call during ``forward(*args)`` (tensors cloned)."""
    from torchinferno.graph.subgraph import snapshot

    seen: list = []

    def hook(mod, a, kw, out):
        if not seen:
            seen.append((snapshot(tuple(a)), dict(kw), snapshot(out)))

    h = module.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            forward(*args)
    finally:
        h.remove()
    if not seen:
        raise ConfigError("the region's module is not called by the prefill forward (pick a module on the forward path)")
    return seen[0]


def profile_region(out_dir: str | Path, region: str, source_run: str | Path | None = None, cfg=None,
                   iters: int = 20, device: str | None = None) -> dict:
    from torchinferno.graph.capture import module_path, trace_with_make_fx
    from torchinferno.graph.compile import time_callable
    from torchinferno.graph.model_forward import prefill_forward
    from torchinferno.graph.standalone import module_source
    from torchinferno.graph.subgraph import capture_boundary_values, extract_subgraph, max_abs_diff
    from torchinferno.workbench.graph_artifacts import retrace_run, trace_config, write_graph_artifacts
    from torchinferno.workbench.profiling import memory_profile, model_bytes, profile_calls, reset_memory
    from torchinferno.workbench.repro_templates import graph_repro
    from torchinferno.workbench.subgraph_run import save_graph_case, tolerance_for

    if iters < 1:
        raise ConfigError(f"--iters must be >= 1, got {iters}")
    run = retrace_run(source_run, device) if source_run is not None else trace_config(cfg)
    path, module = resolve_region(run.model, region)
    args, kwargs, expected = capture_module_call(run.model, module, prefill_forward(run.model, run.inputs), run.inputs.args)
    slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    tensors = [args[i] for i in slots]

    def call(*ts):
        full = list(args)
        for i, t in zip(slots, ts):
            full[i] = t
        return module(*full, **kwargs)

    out = ArtifactDir(out_dir, "profile-region")
    reset_memory(run.config.device)
    eager_us = time_callable(call, tensors, iters)
    _, ops = profile_calls(lambda: call(*tensors), run.config.device, out.path("chrome_trace.json"),
                           iters=max(1, iters // 4), label=f"region:{region}")
    out.existing("chrome_trace.json", "chrome-trace", "torch.profiler trace of the region (open in ui.perfetto.dev)")
    out.json("operator_profile.json", {"workload": f"region {region}", "operators": ops}, "torch.profiler key averages of the region")
    out.json("memory_profile.json", memory_profile(run.config.device, {"region_weight_bytes": model_bytes(module)}),
             "allocator statistics (CUDA) or process RSS (CPU) around the region's timing and profile")

    gm = trace_with_make_fx(call, tensors, module=module)
    with torch.no_grad():
        graph_out = gm(*tensors)
    graph_err = max_abs_diff([graph_out], [expected])
    rg = write_graph_artifacts(out, gm, {"region": region, "module_path": path}, stem="region_graph",
                               what=f"region {region} traced alone (ids local to this graph)")
    tol = tolerance_for(next(run.model.parameters()).dtype)
    save_graph_case(out, "region_tensors.pt", gm, tensors, [expected], "constants, inputs and eager outputs of the region")
    out.python("region_repro.py", graph_repro(module_source(gm, "Region"), "Region", "region_repro.py", "region_tensors.pt",
                                              f"Region {region}", tol, run.config.device), "standalone script: runs the region graph")

    ids = [n.meta["ti_node_id"] for n in run.gm.graph.nodes
           if n.op == "call_function" and (path == "" or module_path(n) == path or module_path(n).startswith(path + "."))]
    slice_err = None
    if ids:
        sub, spec = extract_subgraph(run.gm, ids)
        ins, exp = capture_boundary_values(run.gm, run.inputs.args, spec)
        with torch.no_grad():
            slice_err = max_abs_diff(sub(*ins), exp)
    info = {
        "region": region, "module_path": path or "(root)", "module_class": type(module).__qualname__, "source_run": str(source_run) if source_run else None,
        "input_shapes": [list(t.shape) for t in tensors], "eager_median_us": round(eager_us, 3), "iters": iters,
        "graph_nodes": rg["num_nodes"], "graph_max_abs_diff_vs_eager": graph_err,
        "full_graph_node_ids": ids, "full_graph_node_range": [min(ids), max(ids)] if ids else None,
        "slice_max_abs_diff_vs_source": slice_err, "tolerance": tol,
        "ok": graph_err <= tol and (slice_err is None or slice_err <= tol),
    }
    out.json("region_spec.json", info, "the region: module path, class, inputs, timing, its node ids in the run's full "
                                       "graph, comparisons")
    return out.finish(**{k: info[k] for k in ("region", "module_class", "eager_median_us", "graph_nodes", "ok")},
                      full_graph_nodes=len(ids))
