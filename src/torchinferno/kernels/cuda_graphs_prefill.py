"""CUDA graph capture/replay of one fresh prompt's prefill, one graph per token-count bucket.

A small eager prefill is bound by the host, not the device: on an 8B Llama on an H100, 128 tokens take 6.6-6.8 ms of
kernels but 13-14 ms of wall time in one process (runs 69-70, ``benchmarks/probe_prefill_host.py``), and under
``serve`` that step scatters between 15 and 35 ms with the host's noise (run 65). Replaying a captured graph makes
the step one launch, so its time is the device's.

``CudaGraphPrefillRunner`` covers the step the eager path already special-cases: **one** sequence, **no** cached
context (``num_computed_tokens == 0``), ``T <= max(buckets)`` tokens. It owns static ``input_ids`` / ``positions`` /
``slot_mapping`` buffers of the largest bucket and a one-element ``last_row`` index; a step of ``T`` tokens runs the
smallest bucket ``Tb >= T`` with the metadata of one fresh prompt of ``Tb`` tokens and returns the logits of row
``T - 1`` only (``[1, V]`` fp32, a view of a static buffer: overwritten by the next replay of any bucket).

Padded rows ``T <= t < Tb`` cannot change a live row, by construction:

* ``slot_mapping = -1``: the KV append writes nothing for them;
* attention is causal over the one sequence, so row ``t < T`` attends to rows ``<= t`` only (all live); every other
  op of a dense decoder is row-wise. Families whose ops mix rows otherwise (routing capacity, sparse indexers) do
  not declare ``supports_prefill_graphs`` on their attention modules and never get here.

Capture needs every attention module of the model to declare ``supports_prefill_graphs`` (its fresh-prompt path reads
no host value a graph would freeze: ``TritonPagedAttention``'s SDPA path). Without CUDA the runner runs the same
padded buffers eagerly (``use_graphs=False``), which is how the padding invariants are tested on CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.kernels.cuda_graphs import (
    Bucketed,
    backend_supports_graphs,
    capture_graphs,
    fresh_prompt_meta,
    sorted_buckets,
)
from torchinferno.models.common.attention_metadata import AttentionMetadata

__all__ = ["DEFAULT_PREFILL_BUCKETS", "CudaGraphPrefillRunner", "prefill_buckets", "supports_prefill_graphs"]

DEFAULT_PREFILL_BUCKETS = (16, 32, 64, 96, 128, 192, 256, 384, 512)


def prefill_buckets(max_tokens: int) -> tuple[int, ...]:
    """The default buckets up to ``max_tokens`` (which ends the list when it is not a default bucket); () for 0."""
    if max_tokens <= 0:
        return ()
    return tuple(b for b in DEFAULT_PREFILL_BUCKETS if b < max_tokens) + (max_tokens,)


def supports_prefill_graphs(model: nn.Module) -> bool:
    """Every attention module of ``model`` declares ``supports_prefill_graphs`` (and there is at least one)."""
    return backend_supports_graphs(model, "supports_prefill_graphs")


class CudaGraphPrefillRunner(Bucketed):
    """One fresh prompt's prefill from per-bucket CUDA graphs (module docstring).

    ``model``: a family model (``forward(ids, positions, kv_caches, meta)``, ``compute_logits``), or its step wrapper.
    ``kv_caches``: the per-layer cache tuples the model writes (never reallocated after capture).
    """

    def __init__(self, model: nn.Module, kv_caches, block_size: int, buckets=DEFAULT_PREFILL_BUCKETS,
                 use_graphs: bool | None = None):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.buckets = sorted_buckets(buckets, "prefill")
        self.device = next(model.parameters()).device
        can = self.device.type == "cuda" and supports_prefill_graphs(model)
        self.use_graphs = can if use_graphs is None else (use_graphs and can)
        tmax, dev = self.buckets[-1], self.device
        self.input_ids = torch.zeros(tmax, dtype=torch.long, device=dev)
        self.positions = torch.arange(tmax, dtype=torch.long, device=dev)  # a fresh prompt starts at position 0
        self.slot_mapping = torch.full((tmax,), -1, dtype=torch.long, device=dev)
        self.last_row = torch.zeros(1, dtype=torch.long, device=dev)
        self._metas: dict[int, AttentionMetadata] = {}
        self._live = 0  # rows [0, _live) of slot_mapping may hold the previous step's live slots
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.num_replays = 0
        self.num_eager = 0

    def _meta(self, T: int) -> AttentionMetadata:
        """One fresh prompt of ``T`` tokens over rows ``[:T]`` of the static slot mapping."""
        m = self._metas.get(T)
        if m is None:
            m = self._metas[T] = fresh_prompt_meta(T, self.slot_mapping[:T], self.block_size)
        return m

    def _forward(self, T: int) -> torch.Tensor:
        h = self.model(self.input_ids[:T], self.positions[:T], self.kv_caches, self._meta(T))  # [T, D]
        return self.model.compute_logits(h.index_select(0, self.last_row))  # [1, V] fp32

    def _load(self, input_ids: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Live rows in; rows ``n..`` of ``slot_mapping`` are -1 afterwards (ids of padded rows are left as they are:
        they only feed padded rows)."""
        n = input_ids.shape[0]
        torch._foreach_copy_([self.input_ids[:n], self.slot_mapping[:n]], [input_ids, slot_mapping],
                             non_blocking=True)
        self.last_row.fill_(n - 1)
        if self._live > n:
            self.slot_mapping[n:self._live].fill_(-1)
        self._live = n

    @torch.inference_mode()
    def capture(self, warmup: int = 2) -> None:
        """Capture every bucket (largest first, one memory pool shared by these graphs only). No-op without graphs.

        The buckets are replayed one at a time on one stream and each replay's output is consumed (sampling is
        launched) before the next, so sharing one pool among them is safe; the decode graphs keep their own."""
        if not self.use_graphs:
            return
        self._load(self.input_ids[:0], self.slot_mapping[:0])
        self.last_row.zero_()
        self.graphs, self.outputs, _ = capture_graphs(self.device, self.buckets, self._forward, warmup)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        """The prefill of one fresh prompt -> ``[1, V]`` logits of its last token. ``input_ids`` / ``slot_mapping``:
        ``[T]`` on the device, ``1 <= T <= max_tokens`` (positions are ``0..T-1``)."""
        n = input_ids.shape[0]
        T = self.bucket_for(n)
        if T is None or n < 1:
            raise ValueError(f"a graph prefill takes 1..{self.max_tokens} tokens, got {n}")
        self._load(input_ids, slot_mapping)
        g = self.graphs.get(T)
        if g is not None:
            g.replay()
            self.num_replays += 1
            return self.outputs[T]
        self.num_eager += 1
        return self._forward(T)
