"""bench-gpu (d): offline engine throughput, eager runner or decode steps replayed from CUDA graphs."""

from __future__ import annotations

import time

import torch


def _graph_model_runner_cls():
    """A ModelRunner whose pure-decode steps replay CUDA graphs (defined lazily: engine import)."""
    from torchinferno.engine.model_runner import ModelRunner
    from torchinferno.engine.outputs import ModelRunnerOutput
    from torchinferno.kernels.cuda_graphs import DEFAULT_BUCKETS, CudaGraphDecodeRunner
    from torchinferno.text.sampling import sample

    class GraphModelRunner(ModelRunner):
        def __init__(self, model, kv_cache, max_model_len: int, buckets=DEFAULT_BUCKETS):
            super().__init__(model, kv_cache)
            bs = kv_cache.block_size
            self.graph = CudaGraphDecodeRunner(model, kv_cache.tensors, bs, -(-max_model_len // bs), buckets)
            self.graph.capture()
            self.num_graph_steps = 0

        @torch.inference_mode()
        def execute(self, sched):
            reqs = sched.scheduled
            plain = all(s.num_tokens == 1 and s.sample and s.sampling_params.logprobs is None
                        and s.sampling_params.seed is None for s in reqs)
            if not reqs or not plain or self.graph.bucket_for(len(reqs)) is None:
                return super().execute(sched)
            self.forget(sched.finished_ids)
            bs = self.kv_cache.block_size
            n = len(reqs)
            pos = [s.num_computed_tokens for s in reqs]
            width = max(-(-(p + 1) // bs) for p in pos)
            table = [s.block_ids[:width] + [0] * (width - min(width, len(s.block_ids))) for s in reqs]
            slots = [s.block_ids[p // bs] * bs + p % bs for s, p in zip(reqs, pos)]
            host = torch.tensor([[s.token_ids[0] for s in reqs], pos, slots, [p + 1 for p in pos]], dtype=torch.long)
            dev = host.to(self.device, non_blocking=True)
            bt = torch.tensor(table, dtype=torch.int32).to(self.device, non_blocking=True)
            logits = self.graph.run(dev[0], dev[1], dev[2], bt, dev[3].to(torch.int32))
            tokens = sample(logits, [s.sampling_params for s in reqs]).tolist()
            self.num_forward_calls += 1
            self.num_graph_steps += 1
            return ModelRunnerOutput(sampled_token_ids={s.request_id: t for s, t in zip(reqs, tokens)})

    return GraphModelRunner


def engine_throughput(model, num_requests: int, in_len: int, out_len: int, deadline_s: float, graphs: bool,
                      max_num_seqs: int = 256, max_batched_tokens: int = 8192, log=print) -> dict:
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm_engine import LLMEngine

    max_len = in_len + out_len
    kv_mem = max_num_seqs * (max_len + 16) * model.family.kv_spec(model.config).bytes_per_token(torch.bfloat16)
    engine = LLMEngine(model, None, block_size=16, kv_cache_memory=int(kv_mem * 1.02), max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_batched_tokens, max_model_len=max_len, enable_prefix_caching=False)
    t_setup = time.perf_counter()
    if graphs:
        engine.runner = _graph_model_runner_cls()(model, engine.kv_cache, max_len)
    setup_s = time.perf_counter() - t_setup
    exec_s = [0.0]
    inner = engine.runner.execute

    def timed_execute(sched):  # runner time includes the wait for the GPU (sampling syncs)
        t = time.perf_counter()
        try:
            return inner(sched)
        finally:
            exec_s[0] += time.perf_counter() - t

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
    res = {"graphs": graphs, "requests": num_requests, "finished": finished, "complete": finished == num_requests,
           "input_len": in_len, "output_len": out_len, "wall_s": wall, "output_tokens": out_tokens,
           "output_tok_s": out_tokens / wall, "total_tok_s": (st.num_computed_tokens) / wall, "steps": steps,
           "max_batch_seqs": st.max_batch_seqs, "preemptions": st.num_preemptions, "graph_setup_s": setup_s,
           "graph_steps": getattr(engine.runner, "num_graph_steps", 0), "runner_s": exec_s[0],
           "outside_runner_s": wall - exec_s[0]}
    log(f"  engine graphs={graphs}: {out_tokens} output tokens in {wall:.1f} s = {res['output_tok_s']:.0f} tok/s "
        f"({finished}/{num_requests} finished, {steps} steps, max batch {st.max_batch_seqs}); runner {exec_s[0]:.1f} s, "
        f"scheduler/output processing {wall - exec_s[0]:.1f} s")
    del engine
    torch.cuda.empty_cache()
    return res


# ------------------------------------------------------------------------------------- orchestration
