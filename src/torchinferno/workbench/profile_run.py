"""``profile-run``: generate with a model under torch.profiler and capture its graph, in one directory.

Artifacts (all indexed by ``manifest.json``):

* ``run_config.json`` / ``environment.json`` / ``input_ids.json`` -- what ran, where, on what;
* ``output.json`` -- generated token ids per row (greedy, ``ignore_eos``) and timings;
* ``operator_profile.json`` / ``chrome_trace.json`` -- torch.profiler key averages and trace of
  the generation (prefill + every decode step);
* ``memory_profile.json`` -- allocator stats (CUDA) or peak RSS (CPU), weight and KV bytes;
* ``graph.json`` / ``graph.txt`` / ``graph_module.py`` -- the ATen graph of one prefill forward
  with stable node ids (``graph.json`` records the max error of the graph vs the eager forward);
* ``repro.py`` -- standalone script regenerating ``output.json``'s tokens exactly.
"""

from __future__ import annotations

import time
from pathlib import Path

from torchinferno.workbench.artifacts import ArtifactDir
from torchinferno.workbench.run_config import RunConfig, build_model, generate_tokens, make_prompts


def profile_run(out_dir: str | Path, cfg: RunConfig, trace_graph: bool = True) -> dict:
    """Run and profile ``cfg`` into ``out_dir``; returns the manifest."""
    from torchinferno.graph.model_forward import trace_prefill
    from torchinferno.workbench.graph_artifacts import TracedRun, eager_vs_graph, write_graph_artifacts
    from torchinferno.workbench.profiling import environment, memory_profile, model_bytes, profile_calls, reset_memory
    from torchinferno.workbench.repro_templates import run_repro

    cfg.validate()
    out = ArtifactDir(out_dir, "profile-run")
    out.json("run_config.json", cfg.to_dict(), "how to rebuild this run (model, shapes, seed, cache backend)")
    out.json("environment.json", environment(), "python/torch/CUDA/Triton/Helion versions and devices")

    t0 = time.perf_counter()
    model = build_model(cfg)
    build_s = time.perf_counter() - t0
    prompts = make_prompts(cfg, model.config.vocab_size)
    out.json("input_ids.json", {"input_ids": prompts, "seed": cfg.seed}, "prompt token ids, one row per sequence")

    reset_memory(cfg.device)
    t0 = time.perf_counter()
    tokens, ops = profile_calls(lambda: generate_tokens(model, prompts, cfg), cfg.device,
                                out.path("chrome_trace.json"), label="generate")
    gen_s = time.perf_counter() - t0
    out.existing("chrome_trace.json", "chrome-trace", "torch.profiler trace of the generation (open in ui.perfetto.dev)")
    out.json("output.json", {"token_ids": tokens, "new_tokens": cfg.new_tokens, "generate_s_profiled": round(gen_s, 4)},
             "generated token ids per row (greedy, ignore_eos)")
    out.json("operator_profile.json", {"workload": "generate (prefill + decode)", "operators": ops},
             "torch.profiler key averages sorted by self time (us)")
    kv = model.family.kv_spec(model.config)
    kv_bytes = kv.bytes_per_token(next(model.parameters()).dtype) * cfg.batch_size * (cfg.prompt_tokens + cfg.new_tokens)
    out.json("memory_profile.json", memory_profile(cfg.device, {"weight_bytes": model_bytes(model), "kv_cache_bytes": kv_bytes}),
             "allocator statistics (CUDA) or peak RSS (CPU); weight and KV-cache bytes")

    summary = {"model": cfg.model or f"{cfg.model_kind}:{cfg.size}", "build_s": round(build_s, 4),
               "generate_s_profiled": round(gen_s, 4), "tokens_per_row": cfg.new_tokens}
    if trace_graph:
        t0 = time.perf_counter()
        gm, inputs = trace_prefill(model, prompts)
        err = eager_vs_graph(TracedRun(cfg, model, gm, inputs, None))
        data = write_graph_artifacts(out, gm, {"workload": "prefill forward -> last-token logits",
                                               "max_abs_diff_vs_eager": err})
        summary.update(graph_nodes=data["num_nodes"], graph_signature=data["signature"],
                       trace_s=round(time.perf_counter() - t0, 4), graph_max_abs_diff_vs_eager=err)
    out.python("repro.py", run_repro(cfg.to_dict(), prompts, tokens), "standalone script: regenerates output.json's tokens")
    return out.finish(**summary)
