"""Where a small eager prefill's time goes (issue 21: the served C 1 TTFT's prefill step varies 15-35 ms on an
8B-shape Llama, run 65; the device work of 128 tokens is a few ms). One ``LLMEngine`` per ``--prefill-graph-tokens``
value (CUDA graphs for decode; 0: prefill eager, as in runs 69-70; 512: one fresh prompt's prefill from a graph, run
71): 128-token prompts with one output token each, timed per request; then one prefill under ``torch.profiler``
(the last engine's): host time of the step, device kernel time, launches, top host ops (self CPU) and kernels.

    python benchmarks/probe_prefill_host.py [--size llama3-8b] [--device cuda] [--tokens 128] [--requests 30]
        [--prefill-graph-tokens 0 512] [--idle-ms 3 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="llama3-8b")
    ap.add_argument("--model", default=None, help="a model name or directory instead of a random llama3 --size")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--idle-ms", type=float, nargs="*", default=[],
                    help="also time requests after this long idle between them: blocked (sleep) and spinning")
    ap.add_argument("--prefill-graph-tokens", type=int, nargs="+", default=[0],
                    help="EngineConfig.cuda_graph_prefill_tokens to run, one engine each (0: eager prefill, as run 69)")
    ap.add_argument("--serve-sized", action="store_true", help="serve's sizes: 0.9 of the memory, 256 seqs, 8192 "
                    "batched tokens, the model's whole context (run 65's engine)")
    a = ap.parse_args()
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.llm_engine import LLMEngine

    which = {"model": a.model} if a.model else {"model_kind": "llama3", "size": a.size}
    model = build_model(ModelSpec(**which, dtype=a.dtype, device=a.device))
    cfg = EngineConfig(block_size=16, kv_cache_memory="2GiB", max_num_seqs=8,
                       max_model_len=min(1024, model.config.max_position_embeddings))
    V = model.config.vocab_size - 1
    p = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if a.serve_sized:
        cfg = dataclasses.replace(cfg, kv_cache_memory=None, gpu_memory_utilization=0.9, max_num_seqs=256,
                                  max_num_batched_tokens=8192, max_model_len=model.config.max_position_embeddings)
    # sync, then async scheduling (serve's default); the profile is of the last. A serve-sized pool holds 0.9 of the
    # device, so a second engine beside it cannot fit (run 69): async only
    runs = [(mode, pg) for pg in a.prefill_graph_tokens for mode in ((True,) if a.serve_sized else (False, True))]
    for mode, pg in runs:
        eng = None  # the previous engine's pool and graphs go before the next one's are made
        if cuda:
            torch.cuda.empty_cache()
        eng = LLMEngine(model, config=dataclasses.replace(cfg, async_scheduling=mode, cuda_graph_prefill_tokens=pg))

        def one(i: int) -> float:
            eng.add_request(f"r{i}", [(i * 7 + j) % V + 1 for j in range(a.tokens)], p)  # no prefix hits
            sync()
            t = time.perf_counter()
            eng.run_to_completion()
            sync()
            return (time.perf_counter() - t) * 1e3

        for i in range(5):
            one(10_000 + i)
        ms = [one(i) for i in range(a.requests)]
        q = statistics.quantiles(ms, n=10)
        print(f"{a.model or a.size} async={mode} prefill graphs={pg} ({eng.runner.num_graph_prefills} graph prefills) "
              f"{a.tokens}-token prefill + 1 token, per request: median "
              f"{statistics.median(ms):.2f} ms, p10 {q[0]:.2f}, p90 {q[-1]:.2f}, min {min(ms):.2f}, max {max(ms):.2f}")
        print("  all:", " ".join(f"{x:.1f}" for x in ms))
        # a served C 1 engine idles ~2-3 ms between requests (run 65): the same after blocking or spinning that long
        sets = [(idle, how) for idle in (a.idle_ms if mode else ()) for how in ("sleep", "spin")]
        for k, (idle, how) in enumerate(sets):
            ms = []
            for i in range(a.requests):
                t_end = time.perf_counter() + idle / 1e3
                if how == "sleep":
                    time.sleep(idle / 1e3)
                while time.perf_counter() < t_end:
                    pass
                ms.append(one(100_000 * (k + 1) + 1000 * i))  # prompts no earlier set used
            print(f"  after {idle:g} ms idle ({how}): median {statistics.median(ms):.2f} ms, min {min(ms):.2f}, "
                  f"max {max(ms):.2f}; all: " + " ".join(f"{x:.1f}" for x in ms))
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    eng.add_request("prof", [(j * 13) % V + 1 for j in range(a.tokens)], p)
    sync()
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        eng.run_to_completion()
        sync()
        wall = (time.perf_counter() - t) * 1e3
    ev = prof.key_averages()
    dev = [e for e in ev if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA")]
    kern_us = sum(e.self_device_time_total for e in dev) if dev else 0.0
    launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                      "cudaLaunchKernelExC"))
    print(f"profiled request: wall {wall:.2f} ms (profiler on), device kernels {kern_us / 1e3:.2f} ms, "
          f"kernel launches {launches}")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    if dev:
        print(ev.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
