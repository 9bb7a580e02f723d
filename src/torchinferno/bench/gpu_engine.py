"""bench-gpu (d): offline engine throughput, eager runner or decode steps replayed from CUDA graphs.

Both modes are the serving engine as shipped: ``graphs=True`` is the default ``LLMEngine`` (its
``CudaGraphModelRunner`` captures the decode buckets at construction when the model's attention
is capturable), ``graphs=False`` is ``EngineConfig.enforce_eager=True``. ``async_scheduling=True``
is ``EngineConfig.async_scheduling`` (host work of step k overlaps the device running step k+1);
then ``runner_s`` is launch time plus the wait for each step's sampled tokens (``wait_s``).
``kv_cache_dtype`` is ``EngineConfig.kv_cache_dtype`` (an FP8 cache halves the KV bytes per step).
"""

from __future__ import annotations

import gc
import time

import torch


def engine_throughput(model, num_requests: int, in_len: int, out_len: int, deadline_s: float, graphs: bool,
                      max_num_seqs: int = 256, max_batched_tokens: int = 8192, log=print,
                      async_scheduling: bool = False, kv_cache_dtype: torch.dtype | None = None) -> dict:
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm_engine import LLMEngine

    max_len = in_len + out_len
    kv_dtype = kv_cache_dtype or next(model.parameters()).dtype
    kv_mem = max_num_seqs * (max_len + 16) * model.family.kv_spec(model.config).bytes_per_token(kv_dtype)
    t_setup = time.perf_counter()  # KV allocation + (graphs) capture of every decode bucket
    engine = LLMEngine(model, None, block_size=16, kv_cache_memory=int(kv_mem * 1.02), max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_batched_tokens, max_model_len=max_len, enable_prefix_caching=False,
                       enforce_eager=not graphs, async_scheduling=async_scheduling, kv_cache_dtype=kv_dtype)
    # Throwaway requests of this workload's prompt length: kernel compiles and the like stay out of the timing.
    warm = engine.warmup(in_len)
    setup_s = time.perf_counter() - t_setup
    if graphs and not engine.runner.uses_cuda_graphs:
        log("  engine graphs=True: the model's attention backend is not capturable; every step runs eagerly")
    exec_s = [0.0]
    wait_s = [0.0]
    inner = engine.runner.execute_async if async_scheduling else engine.runner.execute

    first_decode_only = [None]  # wall time of the first step with no prompt tokens (prefill phase over)
    decode_only_steps = [0]

    def timed_execute(sched):  # runner time includes the wait for the GPU (sampling syncs)
        t = time.perf_counter()
        if sched.total_num_tokens == sched.num_seqs:
            decode_only_steps[0] += 1
            if first_decode_only[0] is None:
                first_decode_only[0] = t
        try:
            out = inner(sched)
        finally:
            exec_s[0] += time.perf_counter() - t
        if async_scheduling:  # also time the wait in result() (applied one step later)
            result = out.result

            def timed_result():
                t = time.perf_counter()
                try:
                    return result()
                finally:
                    dt = time.perf_counter() - t
                    exec_s[0] += dt
                    wait_s[0] += dt

            out.result = timed_result
        return out

    if async_scheduling:
        engine.runner.execute_async = timed_execute
    else:
        engine.runner.execute = timed_execute
    g = torch.Generator().manual_seed(1)
    params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{i}", torch.randint(0, model.config.vocab_size, (in_len,), generator=g).tolist(), params)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out_tokens = finished = steps = 0
    while engine.has_unfinished():
        if time.perf_counter() - t0 > deadline_s:
            break
        for o in engine.step():
            out_tokens += len(o.new_token_ids)
            finished += int(o.finished)
        steps += 1
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    st = engine.stats()
    res = {"graphs": graphs, "async_scheduling": async_scheduling, "kv_cache_dtype": str(kv_dtype).replace("torch.", ""),
           "requests": num_requests, "finished": finished, "complete": finished == num_requests,
           "input_len": in_len, "output_len": out_len, "wall_s": wall, "output_tokens": out_tokens,
           "output_tok_s": out_tokens / wall, "total_tok_s": (st.num_computed_tokens) / wall, "steps": steps,
           "max_batch_seqs": st.max_batch_seqs, "preemptions": st.num_preemptions, "graph_setup_s": setup_s,
           "graph_steps": st.num_graph_steps, "warmup_s": warm.seconds, "runner_s": exec_s[0], "wait_s": wait_s[0],
           "outside_runner_s": wall - exec_s[0]}
    if first_decode_only[0] is not None:  # phase split: prompts (prefill + mixed steps), then decode-only steps
        res["prefill_phase_s"] = first_decode_only[0] - t0
        res["decode_phase_s"] = wall - res["prefill_phase_s"]
        res["decode_only_steps"] = decode_only_steps[0]
        res["decode_ms_per_step"] = 1e3 * res["decode_phase_s"] / max(1, decode_only_steps[0])
    log(f"  engine graphs={graphs} async={async_scheduling} kv={res['kv_cache_dtype']}: {out_tokens} output tokens in {wall:.1f} s = {res['output_tok_s']:.0f} tok/s "
        f"({finished}/{num_requests} finished, {steps} steps, {st.num_graph_steps} from graphs, max batch "
        f"{st.max_batch_seqs}); runner {exec_s[0]:.1f} s (waiting for sampled tokens {wait_s[0]:.1f} s), "
        f"scheduler/output processing {wall - exec_s[0]:.1f} s")
    if "decode_phase_s" in res:
        log(f"    phases: prompts {res['prefill_phase_s']:.1f} s, then {res['decode_only_steps']} decode-only steps in "
            f"{res['decode_phase_s']:.1f} s = {res['decode_ms_per_step']:.2f} ms/step")
    # The timing wrapper (an instance attribute closing over the runner's own method) is a
    # reference cycle: drop it and collect, or the KV cache outlives this run and the next
    # engine mode runs out of memory.
    vars(engine.runner).pop("execute_async" if async_scheduling else "execute", None)
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return res


# ------------------------------------------------------------------------------------- orchestration


# engine mode -> (CUDA graphs, async scheduling, KV cache dtype (None = the model's), FP8 W8A8 linears)
ENGINE_MODES: dict[str, tuple[bool, bool, torch.dtype | None, bool]] = {
    "graphs": (True, False, None, False), "async": (True, True, None, False), "eager": (False, False, None, False),
    "async-fp8": (True, True, torch.float8_e4m3fn, False),
    "async-w8": (True, True, None, True), "async-w8-fp8": (True, True, torch.float8_e4m3fn, True)}


def quantize_model_fp8(model, log=print) -> dict:
    """Swap the model's linears (not the head) for FP8 W8A8 in place; returns the logits' deviation
    from the bf16 model on one random 256-token prompt (quality beside the speed)."""
    from torchinferno.bench.gpu_peers import logits_agreement, our_logits
    from torchinferno.kernels.fp8_linear import swap_linear_for_fp8

    ids = torch.randint(0, model.config.vocab_size, (256,), device=next(model.parameters()).device)
    before = our_logits(model, ids)
    names = swap_linear_for_fp8(model)
    torch.cuda.empty_cache()
    q = {"swapped_linears": len(names), "kernels": sorted({m.kernel for m in model.modules() if hasattr(m, "weight_fp8")}),
         **logits_agreement(our_logits(model, ids), before)}
    log(f"    FP8 W8A8 linears: {q['swapped_linears']} swapped ({', '.join(q['kernels'])}); logits vs bf16: rel diff "
        f"{q['rel_diff']:.3e}, argmax agreement {100 * q['argmax_agreement']:.0f}%")
    return q
