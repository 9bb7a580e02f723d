"""Whole-step CUDA graphs for mixed steps: decodes, prefill chunks over cached context, several prompts, prefix hits.

The piecewise runner (``kernels.cuda_graphs_piecewise``) replays every op but attention from graphs and runs the
``L`` attention calls eagerly, because the attention path it calls picks kernels and grids from host lengths. Under
``serve`` those eager calls made mixed 8B steps host-bound (9-12 ms of launch against ~8 ms of device work, RESULTS
session 29). This runner captures the *whole* forward of a token bucket ``Tb`` in one graph instead: its metadata
are static buffers padded to ``Tb`` token rows and ``Tb`` sequences (``AttentionMetadata.graph_padded``), and the
attention backend runs one varlen kernel over a grid fixed by those shapes (``kernels.api.graph_padded_attention``),
decode rows included. A step of ``n <= Tb`` tokens in ``B <= n`` sequences then costs one replay.

Padding (what makes a padded row harmless):

* token rows ``n..Tb``: ``slot_mapping = -1`` (the KV append writes nothing), they belong to no sequence (attention
  leaves them zero) and every other op of a dense decoder is row-wise, so no live row reads them;
* sequences ``B..Tb``: ``query_start_loc = n`` (no query tokens: their kernel programs exit at once) and
  ``seq_lens = 0``; their block-table rows are never read;
* block-table columns past the step's width keep stale values that no live row reads (its length bounds the read).

Models qualify when every attention module declares ``supports_mixed_graphs`` (``TritonPagedAttention``) and every
other op is row-wise (dense decoders; not capacity-limited MoE routing). Without CUDA (or ``use_graphs=False``) ``run``
executes the same padded forward eagerly, which is how the padding is tested on CPU (``TorchAttention`` takes
graph-padded metadata through its host lists) and on Triton's interpreter (the kernel path).
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.kernels.cuda_graphs import Bucketed, backend_supports_graphs, capture_graphs, sorted_buckets
from torchinferno.models.common.attention_metadata import AttentionMetadata

__all__ = ["MixedGraphRunner", "supports_mixed_graphs"]


def supports_mixed_graphs(model: nn.Module) -> bool:
    """Every attention module of ``model`` declares ``supports_mixed_graphs`` (and there is at least one)."""
    return backend_supports_graphs(model, "supports_mixed_graphs")


class MixedGraphRunner(Bucketed):
    """Any step of up to ``max_tokens`` rows as one CUDA graph per token bucket (module docstring).

    ``model``: a family model (``forward(ids, positions, kv_caches, meta) -> hidden [T, D]``); ``kv_caches``: the
    per-layer cache tuples it writes (never reallocated after capture); ``max_blocks_per_seq``: the block-table width
    of the static buffer. ``run`` returns ``[n, D]`` hidden states, a view of a static buffer the next ``run``
    overwrites. Same interface as ``PiecewiseGraphRunner``.
    """

    def __init__(self, model: nn.Module, kv_caches, block_size: int, max_blocks_per_seq: int, buckets,
                 use_graphs: bool | None = None):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.max_blocks = max_blocks_per_seq
        self.buckets = sorted_buckets(buckets, "mixed-graph")
        self.device = dev = next(model.parameters()).device
        can = dev.type == "cuda" and supports_mixed_graphs(model)
        self.use_graphs = can if use_graphs is None else (use_graphs and can)
        tmax = self.max_tokens
        i32 = dict(dtype=torch.int32, device=dev)
        self.input_ids = torch.zeros(tmax, dtype=torch.long, device=dev)
        self.positions = torch.zeros(tmax, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((tmax,), -1, dtype=torch.long, device=dev)
        self.query_start_loc = torch.zeros(tmax + 1, **i32)  # every sequence empty until a step loads
        self.seq_lens = torch.zeros(tmax, **i32)
        self.block_tables = torch.zeros(tmax, max_blocks_per_seq, **i32)
        self._live = 0  # token rows [0, _live) of ids / positions / slots may hold a previous step's live rows
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._pool = None
        self.num_replays = 0
        self.num_eager = 0

    def _meta(self, T: int, live: AttentionMetadata | None) -> AttentionMetadata:
        """The static buffers' first ``T`` rows as graph-padded metadata; host lists from ``live`` (the step's own
        metadata, for backends that read them eagerly) or empty (capture)."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: T + 1], seq_lens=self.seq_lens[:T],
            slot_mapping=self.slot_mapping[:T], block_tables=self.block_tables[:T], block_size=self.block_size,
            query_lens_list=[] if live is None else live.query_lens_list,
            seq_lens_list=[] if live is None else live.seq_lens_list,
            has_padding=True, graph_padded=True)

    def _forward(self, T: int, live: AttentionMetadata | None = None) -> torch.Tensor:
        return self.model(self.input_ids[:T], self.positions[:T], self.kv_caches, self._meta(T, live))  # [T, D]

    def _load(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, T: int) -> None:
        """Copy a step's ``n`` tokens / ``B`` sequences into the static buffers and pad the rest up to ``T``."""
        n, B = input_ids.shape[0], meta.num_seqs
        w = meta.block_tables.shape[1]
        if w > self.max_blocks:
            raise ValueError(f"block table has {w} columns; the runner was built for {self.max_blocks}")
        torch._foreach_copy_(
            [self.input_ids[:n], self.positions[:n], self.slot_mapping[:n], self.query_start_loc[: B + 1],
             self.seq_lens[:B], self.block_tables[:B, :w]],
            [input_ids, positions, meta.slot_mapping, meta.query_start_loc, meta.seq_lens, meta.block_tables],
            non_blocking=True)
        # sequences B..T: no tokens, no context (their programs exit before reading a table row)
        self.query_start_loc[B + 1 : T + 1].fill_(n)
        self.seq_lens[B:T].zero_()
        # Invariant: token rows >= self._live hold padding. Only rows an earlier, larger step filled need resetting.
        if self._live > n:
            hi = self._live
            self.input_ids[n:hi].zero_()
            self.positions[n:hi].zero_()
            self.slot_mapping[n:hi].fill_(-1)
        self._live = n

    @torch.inference_mode()
    def capture(self, warmup: int = 2) -> None:
        """Capture every bucket (largest first, one memory pool). No-op without graphs. Raises ``RuntimeError`` when
        the forward cannot be captured (an op that syncs with the host); the runner then holds no graphs."""
        if not self.use_graphs:
            return
        self.query_start_loc.zero_()  # every sequence empty while capturing: attention reads and writes nothing
        self.seq_lens.zero_()
        self.slot_mapping.fill_(-1)
        self._live = 0
        graphs, outputs, self._pool = capture_graphs(self.device, self.buckets, self._forward, warmup, self._pool)
        self.graphs.update(graphs)
        self.outputs.update(outputs)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states ``[n, D]`` of one step's ``n`` tokens (``1 <= n <= max_tokens``; ``input_ids`` /
        ``positions`` ``[n]`` on the device, ``meta`` the step's attention metadata for exactly those rows)."""
        n = input_ids.shape[0]
        T = self.step_bucket(n, "mixed-graph")
        self._load(input_ids, positions, meta, T)
        g = self.graphs.get(T)
        if g is None:  # no graphs: the same padded forward, eagerly
            self.num_eager += 1
            return self._forward(T, meta)[:n]
        g.replay()
        self.num_replays += 1
        return self.outputs[T][:n]
