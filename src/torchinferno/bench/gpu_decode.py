"""The batch-1/batch-N decode measurements of ``bench-gpu`` (a)/(b): a random-weight model and a graph-replayed step.

``DecodeBench`` owns a static paged cache and a ``CudaGraphDecodeRunner``; ``measure`` times one decode step
(inputs copied into the static buffers + graph replay: as issued by the host, and device only, i.e. queued behind
a spin kernel so the host's issue time drops out), a device-resident greedy loop, the eager step and its kernel
profile, against the bandwidth bound ``(weight bytes + KV bytes read) / bandwidth``.
"""

from __future__ import annotations

import torch

from torchinferno.bench.gpu_timing import cuda_time_ms, device_time_ms, profile_kernels
from torchinferno.models.common.step_model import step_model, unwrap


def build_random_model(size: str = "llama3-8b", device="cuda", dtype=torch.bfloat16, seed: int = 0):
    """A family model of a named size with random weights, built on meta and materialized on ``device``."""
    from torchinferno.models.common.attention_triton import TritonPagedAttention
    from torchinferno.models.common.module_utils import materialize
    from torchinferno.models.registry import get_family

    fam = get_family("llama3")
    cfg = fam.size(size)
    model = fam.build(cfg, device="meta", variant="v1", attention_backend=TritonPagedAttention)
    materialize(model, device, dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2, generator=g)
            else:
                p.normal_(0.0, 0.02, generator=g)
    model.eval()
    model.family = fam
    return model


class DecodeBench:
    """Static paged cache + CudaGraphDecodeRunner over one model; device-resident greedy loop."""

    def __init__(self, model, max_batch: int, max_ctx: int, block_size: int = 16, buckets=(1, 64)):
        from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner

        self.model = model
        self.bs = block_size
        self.dev = next(model.parameters()).device
        spec = model.family.kv_spec(model.config)
        self.max_blocks = -(-max_ctx // block_size) + 1
        self.caches = spec.allocate(max_batch * self.max_blocks + 1, block_size, torch.bfloat16, self.dev)
        for layer in self.caches:
            for t in layer:
                t.normal_()
        self.kv_bytes_per_token = spec.bytes_per_token(torch.bfloat16)
        self.runner = CudaGraphDecodeRunner(model, self.caches, block_size, self.max_blocks, batch_sizes=buckets)
        self.runner.capture()

    def set_fused_step(self, on: bool, **options) -> bool:
        """Run the model's fused CUDA decode step (or the modules) from now on and recapture the batch-1 graph."""
        base = unwrap(self.model)
        self.model = step_model(base, self.dev, **options) if on else base
        self.runner.model = self.model
        self.runner.recapture([1])
        return self.model is not base

    def inputs(self, batch: int, ctx: int):
        perm = torch.randperm(batch * self.max_blocks, device=self.dev) + 1
        bt = perm.view(batch, self.max_blocks).to(torch.int32)
        pos = torch.full((batch,), ctx, dtype=torch.long, device=self.dev)
        ids = torch.randint(0, self.model.config.vocab_size, (batch,), device=self.dev)
        return ids, pos, bt

    def slots(self, bt, pos):
        return bt.gather(1, (pos // self.bs).view(-1, 1)).view(-1).long() * self.bs + pos % self.bs

    def step(self, ids, pos, bt):
        return self.runner.run(ids, pos, self.slots(bt, pos), bt, (pos + 1).to(torch.int32))

    def loop(self, ids, pos, bt, steps: int):
        """Greedy decode ``steps`` tokens with no host sync inside the loop."""
        for _ in range(steps):
            ids = self.step(ids, pos, bt).argmax(-1)
            pos = pos + 1
        return ids

    def measure(self, batch: int, ctx: int, weight_bytes: int, bw: float, loop_steps: int = 32) -> dict:
        ids, pos, bt = self.inputs(batch, ctx)
        # A step's inputs as a scheduler hands them over (slots and lengths computed outside the timing):
        # the timed step is their copy into the static buffers + the graph replay.
        slots, lens = self.slots(bt, pos), (pos + 1).to(torch.int32)
        run_step = lambda: self.runner.run(ids, pos, slots, bt, lens)  # noqa: E731
        step_ms = cuda_time_ms(run_step, iters=30)
        step_device_ms = device_time_ms(run_step, iters=30)  # the same step, with the host's issue time taken out
        loop_ms = cuda_time_ms(lambda: self.loop(ids, pos, bt, loop_steps), iters=3, warmup=1) / loop_steps
        graphs = self.runner.use_graphs
        self.runner.use_graphs = False
        saved, self.runner.graphs = self.runner.graphs, {}
        eager_ms = cuda_time_ms(run_step, iters=10)
        prof = profile_kernels(run_step)
        self.runner.graphs, self.runner.use_graphs = saved, graphs
        kv_read = batch * (ctx + 1) * self.kv_bytes_per_token
        bound_ms = (weight_bytes + kv_read) / bw * 1e3
        return {"batch": batch, "context": ctx, "step_ms": step_ms, "step_device_ms": step_device_ms,
                "device_fraction_of_bound": bound_ms / step_device_ms, "loop_ms_per_step": loop_ms, "eager_step_ms": eager_ms,
                "tok_s": batch / loop_ms * 1e3, "bytes": weight_bytes + kv_read, "bound_ms": bound_ms,
                "fraction_of_bound": bound_ms / step_ms, "loop_fraction_of_bound": bound_ms / loop_ms, "profile": prof,
                "gemm_gb_s": weight_bytes / prof["groups_ms"].get("gemm", float("nan")) / 1e6}
