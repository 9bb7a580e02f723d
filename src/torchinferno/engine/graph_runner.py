"""Model runner whose decode steps replay CUDA graphs, and the engine's choice of runner.

``CudaGraphModelRunner`` captures one graph per batch-size bucket at construction
(``kernels.cuda_graphs.CudaGraphDecodeRunner``: static input buffers, buckets up to
``max_num_seqs``). A step replays the smallest bucket that holds it when it is *plain decode*:
every scheduled request adds one token, samples it, and needs nothing the graph cannot do (no
per-request seed, no logprobs). Everything else (prefill, chunked prefill, mixed batches, seeded
or logprob requests, batches above the largest bucket) runs the eager ``ModelRunner.execute``
on the same KV cache. Async scheduling works on both paths: a decode whose input token is still
in flight (``PLACEHOLDER_TOKEN``) is replayable, its token is gathered on the device into the
step's ``input_ids`` before they are loaded into the graph's static buffer.

Padded bucket rows never touch a live KV row: their ``slot_mapping`` is ``-1`` (the KV append
skips them) and their block-table row points at a scratch block they only read (see
``kernels/cuda_graphs.py``; tested in ``tests/kernels/test_cuda_graphs.py``).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from torchinferno.cache.kv_cache import PagedKVCache
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.model_runner import ModelRunner
from torchinferno.engine.outputs import ScheduledRequest, SchedulerOutput
from torchinferno.engine.step_handle import StepHandle
from torchinferno.kernels.cuda_graphs import (
    DEFAULT_BUCKETS,
    CudaGraphDecodeRunner,
    backend_supports_graphs,
)
from torchinferno.kernels.cuda_graphs_mixed import MixedGraphRunner, supports_mixed_graphs
from torchinferno.kernels.cuda_graphs_piecewise import PiecewiseGraphRunner, piecewise_buckets, supports_piecewise_graphs
from torchinferno.kernels.cuda_graphs_prefill import CudaGraphPrefillRunner, prefill_buckets, supports_prefill_graphs
from torchinferno.models.common.step_model import step_model, unwrap

log = logging.getLogger(__name__)

__all__ = ["CudaGraphModelRunner", "can_use_cuda_graphs", "graph_batch_sizes", "make_model_runner"]

# Batches above this many sequences run eagerly: each bucket costs capture time and graph memory,
# and at this size the step is dominated by GPU work, not launch overhead.
MAX_GRAPH_BATCH = 512


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """Buckets for an engine admitting ``max_num_seqs``: the defaults below it, then steps of 64,
    ending exactly at ``min(max_num_seqs, MAX_GRAPH_BATCH)``."""
    top = max(1, min(max_num_seqs, MAX_GRAPH_BATCH))
    sizes = [b for b in DEFAULT_BUCKETS if b < top]
    b = DEFAULT_BUCKETS[-1] + 64
    while b < top:
        sizes.append(b)
        b += 64
    return sizes + [top]


def can_use_cuda_graphs(model: nn.Module, kv_cache: PagedKVCache) -> bool:
    """The cache is on CUDA and every attention backend of ``model`` is capturable."""
    return kv_cache.device.type == "cuda" and torch.cuda.is_available() and backend_supports_graphs(model)


def make_model_runner(model: nn.Module, kv_cache: PagedKVCache, config: EngineConfig, max_model_len: int) -> ModelRunner:
    """The engine's runner: CUDA graphs when possible and not ``config.enforce_eager``, else eager.

    The runner's model is chosen here, once: the family's lean decode step for the cache's device when it has one
    (the fused batch-1 CUDA step, so graphs capture it; the lean CPU step on pre-packed weights), else the modules
    (``models/common/step_model``).
    """
    model = step_model(model, kv_cache.device)
    if not config.enforce_eager and can_use_cuda_graphs(model, kv_cache):
        return CudaGraphModelRunner(model, kv_cache, config.max_num_seqs, max_model_len,
                                    prefill_tokens=config.cuda_graph_prefill_tokens,
                                    piecewise_tokens=config.cuda_graph_piecewise_tokens,
                                    mixed_mode=config.cuda_graph_mixed_mode)
    return ModelRunner(model, kv_cache, config.max_num_seqs, max_model_len)


def _captured(what: str, runner):
    """``runner`` after its ``capture()``, or None when the capture failed (a backend that captures decode but not
    this kind of step: those steps stay eager, and the log says why)."""
    try:
        runner.capture()
    except RuntimeError as e:
        log.warning("%s CUDA graphs off (capture failed: %s)", what, str(e).splitlines()[0][:200])
        return None
    return runner


class CudaGraphModelRunner(ModelRunner):
    """``ModelRunner`` whose plain decode steps replay per-bucket CUDA graphs (module docstring).

    Construction captures every bucket of ``batch_sizes`` (default ``graph_batch_sizes(max_num_seqs)``)
    against ``kv_cache``, which must never be reallocated afterwards. ``num_graph_steps`` counts
    replayed steps; ``num_forward_calls`` counts every forward (replayed or eager).

    ``prefill_tokens > 0`` also captures the prefill of one fresh prompt of up to that many tokens per length bucket
    (``kernels.cuda_graphs_prefill``; ``num_graph_prefills`` counts those steps) when the model's attention declares
    ``supports_prefill_graphs`` and the cache has one group; a capture that fails leaves prefill eager (logged).
    ``piecewise_tokens > 0`` runs every other step of up to that many tokens as per-token-count graphs around eager
    attention (``kernels.cuda_graphs_piecewise``; ``num_piecewise_steps``) under the same conditions
    (``supports_piecewise_graphs``); a capture that fails leaves those steps eager (logged). With ``mixed_mode="full"``
    those steps replay one whole graph per token bucket instead (``kernels.cuda_graphs_mixed``,
    ``supports_mixed_graphs``); a capture that fails falls back to the piecewise graphs (logged). ``mixed_graph_mode``
    says which replays them ("piecewise", "full", or "eager" when none).
    """

    def __init__(self, model: nn.Module, kv_cache: PagedKVCache, max_num_seqs: int, max_model_len: int,
                 batch_sizes=None, prefill_tokens: int = 0, piecewise_tokens: int = 0, mixed_mode: str = "piecewise"):
        super().__init__(model, kv_cache, max_num_seqs, max_model_len)
        if not can_use_cuda_graphs(model, kv_cache):
            raise ValueError("CUDA graphs need a CUDA KV cache and attention backends with supports_cuda_graphs")
        bs = kv_cache.block_size
        sizes = batch_sizes if batch_sizes is not None else graph_batch_sizes(max_num_seqs)
        self.graph = CudaGraphDecodeRunner(model, kv_cache.tensors, bs, -(-max_model_len // bs), sizes,
                                           use_graphs=True, hybrid=kv_cache.spec.is_hybrid)
        self.graph.capture()
        self.max_graph_batch = self.graph.buckets[-1]
        tokens = min(prefill_tokens, max_model_len)
        if tokens > 0 and not kv_cache.spec.is_hybrid and supports_prefill_graphs(model):
            self.prefill_graphs = _captured("prefill", CudaGraphPrefillRunner(
                model, kv_cache.tensors, bs, prefill_buckets(tokens), use_graphs=True))
        tokens = min(piecewise_tokens, max_model_len)
        base = unwrap(model)  # the module path: a lean step handles one-row decodes only
        if tokens > 0 and not kv_cache.spec.is_hybrid and not getattr(base, "sharded", False):
            if mixed_mode == "full" and supports_mixed_graphs(base):
                self.piecewise = _captured("whole-step mixed", MixedGraphRunner(
                    base, kv_cache.tensors, bs, -(-max_model_len // bs), piecewise_buckets(tokens), use_graphs=True))
            if self.piecewise is None and supports_piecewise_graphs(base):
                self.piecewise = _captured("piecewise", PiecewiseGraphRunner(
                    base, kv_cache.tensors, bs, piecewise_buckets(tokens), use_graphs=True))

    @property
    def uses_cuda_graphs(self) -> bool:
        return True

    @property
    def batch_sizes(self) -> list[int]:
        return list(self.graph.buckets)

    def replayable(self, reqs: list[ScheduledRequest]) -> bool:
        """A plain decode step that fits a captured bucket."""
        if not reqs or len(reqs) > self.max_graph_batch:
            return False
        for s in reqs:
            p = s.sampling_params
            if (len(s.token_ids) != 1 or not s.sample or p.seed is not None or p.logprobs is not None
                    or s.prompt_logprob_targets):
                return False
        return True

    @torch.inference_mode()
    def execute_async(self, sched: SchedulerOutput) -> StepHandle:
        reqs = sched.scheduled
        if not self.replayable(reqs):
            return super().execute_async(sched)
        self._begin(sched)
        # Placeholders are filled in step.input_ids, which graph.run copies into the static buffer.
        step = self._prepare(reqs)
        # [n, V] fp32 view of the bucket's static output: sampled (launched) before the next replay.
        logits = self.graph.run(step.input_ids, step.positions, step.slot_mapping, step.block_tables, step.seq_lens,
                                whole_block_tables=step.whole_block_tables)
        self.num_forward_calls += 1
        self.num_graph_steps += 1
        return self._sample(reqs, step.sample_rows, logits)
