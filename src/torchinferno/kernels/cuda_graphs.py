"""CUDA graph capture/replay of decode steps, one graph per batch-size bucket.

``CudaGraphDecodeRunner`` owns static input buffers (``input_ids``, ``positions``,
``slot_mapping``, ``block_tables``, ``seq_lens``) sized for the largest bucket, captures
``model(...)`` (+ ``compute_logits``) once per bucket and, per step, copies the live rows in,
pads the rest and replays the bucket's graph. A step with ``n`` rows runs the smallest bucket
``>= n``; more rows than the largest bucket run eagerly.

Padded rows (``n <= row < bucket``) are harmless by construction:

* ``slot_mapping = -1``: the KV append writes nothing for them (no live KV row is touched);
* ``block_tables`` row = ``scratch_block`` (default 0) and ``seq_lens = 1``: attention reads one
  token of that block, which is never written through these rows either; their outputs are dropped.

Hybrid KV specs (``hybrid=True``: a sliding group + a whole-sequence group, ``KVSpec.is_hybrid``) add a static
``whole_block_tables`` buffer, padded with ``scratch_block`` like ``block_tables``.

Capture needs a backend whose decode path reads only device tensors (``supports_cuda_graphs``
on the attention module, e.g. ``TritonPagedAttention``): the torch reference backend reads host
``seq_lens_list`` values, which a graph would freeze. Without CUDA or such a backend the runner
runs the same padded buffers eagerly (``use_graphs == False``), which is also how the padding
invariants are tested on CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.models.common.attention_metadata import AttentionMetadata

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)


def backend_supports_graphs(model: nn.Module, flag: str = "supports_cuda_graphs") -> bool:
    """All attention backends of ``model`` declare ``flag`` (and there is at least one): ``supports_cuda_graphs`` for
    decode steps, ``supports_prefill_graphs`` for a fresh prompt's prefill (``kernels.cuda_graphs_prefill``)."""
    from torchinferno.models.common.attention import TorchAttention

    flags = [getattr(m, flag, False) for m in model.modules()
             if isinstance(m, TorchAttention) or hasattr(m, "supports_cuda_graphs")]
    return bool(flags) and all(flags)


def sorted_buckets(sizes, what: str) -> list[int]:
    """``sizes`` as a sorted list of distinct positive ints (ValueError naming ``what`` otherwise)."""
    out = sorted(set(int(b) for b in sizes))
    if not out or out[0] < 1:
        raise ValueError(f"{what} buckets must be positive token counts, got {sizes!r}")
    return out


class Bucketed:
    """``buckets`` (sorted, set by the subclass): ``bucket_for(n)`` is the smallest ``>= n`` (None past the last)."""

    buckets: list[int]

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def step_bucket(self, n: int, what: str) -> int:
        """The bucket of a step of ``n`` tokens that must fit one (ValueError naming ``what`` otherwise)."""
        T = self.bucket_for(n)
        if T is None or n < 1:
            raise ValueError(f"a {what} step takes 1..{self.max_tokens} tokens, got {n}")
        return T


def fresh_prompt_meta(T: int, slot_mapping: torch.Tensor, block_size: int) -> AttentionMetadata:
    """One fresh prompt of ``T`` tokens whose KV goes to ``slot_mapping [T]`` (the host lists are what select an
    attention backend's fresh-prompt path; its block table is read by no such path)."""
    dev = slot_mapping.device
    return AttentionMetadata(query_start_loc=torch.tensor([0, T], dtype=torch.int32, device=dev),
                             seq_lens=torch.tensor([T], dtype=torch.int32, device=dev), slot_mapping=slot_mapping,
                             block_tables=torch.zeros(1, 1, dtype=torch.int32, device=dev), block_size=block_size,
                             query_lens_list=[T], seq_lens_list=[T], has_padding=True)


def capture_graphs(device: torch.device, sizes, forward, warmup: int, pool=None):
    """One CUDA graph of ``forward(size)`` per size, largest first, sharing one memory pool (``pool``, or the first
    graph's) -> ``(graphs, outputs, pool)`` keyed by size. Each size runs ``warmup`` times on a side stream first
    (kernel compiles, attention plans, the allocator settles); the graphs must be replayed one at a time, each output
    consumed before the next replay."""
    sizes = sorted(sizes, reverse=True)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for n in sizes:
            for _ in range(warmup):
                forward(n)
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graphs, outputs = {}, {}
    for n in sizes:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            outputs[n] = forward(n)
        if pool is None:
            pool = g.pool()
        graphs[n] = g
    torch.cuda.synchronize(device)
    return graphs, outputs, pool


class CudaGraphDecodeRunner(Bucketed):
    """Decode-step executor with per-bucket CUDA graphs and an eager fallback.

    ``model``: a family model (``forward(ids, positions, kv_caches, meta)``, ``compute_logits``).
    ``kv_caches``: the per-layer cache tuples the model writes (never reallocated).
    ``max_blocks_per_seq``: block-table width of the static buffer (max context / block size).
    ``output``: ``"logits"`` ([n, V] fp32) or ``"hidden"`` ([n, D]).
    """

    def __init__(self, model: nn.Module, kv_caches, block_size: int, max_blocks_per_seq: int,
                 batch_sizes=DEFAULT_BUCKETS, scratch_block: int = 0, output: str = "logits",
                 use_graphs: bool | None = None, hybrid: bool = False):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.max_blocks = max_blocks_per_seq
        self.buckets = sorted(set(int(b) for b in batch_sizes))
        self.scratch_block = scratch_block
        self.output = output
        self.device = next(model.parameters()).device
        can = self.device.type == "cuda" and backend_supports_graphs(model)
        self.use_graphs = can if use_graphs is None else (use_graphs and can)
        bmax = self.buckets[-1]
        dev = self.device
        self.input_ids = torch.zeros(bmax, dtype=torch.long, device=dev)
        self.positions = torch.zeros(bmax, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((bmax,), -1, dtype=torch.long, device=dev)
        self.block_tables = torch.full((bmax, max_blocks_per_seq), scratch_block, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(bmax, dtype=torch.int32, device=dev)
        self.whole_block_tables = torch.full_like(self.block_tables, scratch_block) if hybrid else None
        self.query_start_loc = torch.arange(bmax + 1, dtype=torch.int32, device=dev)
        self._live = 0  # rows [0, _live) of the input buffers may hold a previous step's live rows
        self._views: dict[int, tuple[torch.Tensor, ...]] = {}  # rows -> slices of the 1-D input buffers
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._pool = None
        self.num_replays = 0
        self.num_eager = 0

    # ------------------------------------------------------------------ helpers
    def _meta(self, B: int, seq_lens_list: list[int] | None) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: B + 1],
            seq_lens=self.seq_lens[:B],
            slot_mapping=self.slot_mapping[:B],
            block_tables=self.block_tables[:B],
            whole_block_tables=None if self.whole_block_tables is None else self.whole_block_tables[:B],
            block_size=self.block_size,
            query_lens_list=[1] * B,
            # Host copies are read only by backends that cannot be captured (eager path).
            seq_lens_list=seq_lens_list if seq_lens_list is not None else [self.max_blocks * self.block_size] * B,
            has_padding=True,
        )

    def _forward(self, B: int, seq_lens_list: list[int] | None = None) -> torch.Tensor:
        h = self.model(self.input_ids[:B], self.positions[:B], self.kv_caches, self._meta(B, seq_lens_list))
        return self.model.compute_logits(h) if self.output == "logits" else h

    def _load(self, input_ids, positions, slot_mapping, block_tables, seq_lens, B: int,
              whole_block_tables=None) -> None:
        """Copy ``n`` live rows into the static buffers; rows ``n..B-1`` hold padding afterwards."""
        n = input_ids.shape[0]
        w = block_tables.shape[1]
        if w > self.max_blocks:
            raise ValueError(f"block table has {w} columns; the runner was built for {self.max_blocks}")
        if (whole_block_tables is None) != (self.whole_block_tables is None) and n:
            raise ValueError("a hybrid KV cache runner needs whole_block_tables (and only it does)")
        if whole_block_tables is not None:
            self.whole_block_tables[:n, :w].copy_(whole_block_tables, non_blocking=True)
        views = self._views.get(n)
        if views is None:  # slicing costs host time every step (at most one entry per batch size)
            views = self._views[n] = (self.input_ids[:n], self.positions[:n], self.slot_mapping[:n], self.seq_lens[:n])
        ids_v, pos_v, slot_v, lens_v = views
        # one foreach call instead of five copies: about half the host time of a step's input load
        torch._foreach_copy_([ids_v, pos_v, slot_v, self.block_tables[:n, :w], lens_v],
                             [input_ids, positions, slot_mapping, block_tables, seq_lens], non_blocking=True)
        # Invariant: rows >= self._live hold padding (the buffers start that way). Only rows an
        # earlier, larger step filled need resetting, so a steady batch size launches no fills.
        if self._live > n:
            hi = self._live
            self.input_ids[n:hi].zero_()
            self.positions[n:hi].zero_()
            self.slot_mapping[n:hi].fill_(-1)
            self.block_tables[n:hi].fill_(self.scratch_block)
            if self.whole_block_tables is not None:
                self.whole_block_tables[n:hi].fill_(self.scratch_block)
            self.seq_lens[n:hi].fill_(1)
        self._live = n

    # ------------------------------------------------------------------ capture / run
    @torch.inference_mode()
    def capture(self, batch_sizes=None, warmup: int = 2) -> None:
        """Capture one graph per bucket (largest first, sharing one memory pool). No-op without graphs."""
        if not self.use_graphs:
            return
        self._load(self.input_ids[:0], self.positions[:0], self.slot_mapping[:0], self.block_tables[:0, :0],
                   self.seq_lens[:0], self.buckets[-1])
        graphs, outputs, self._pool = capture_graphs(self.device, batch_sizes or self.buckets, self._forward, warmup,
                                                     self._pool)
        self.graphs.update(graphs)
        self.outputs.update(outputs)

    def recapture(self, batch_sizes) -> None:
        """Drop the graphs of ``batch_sizes`` and capture them again (after the model's forward changed, e.g. a
        decode step was installed). A pool whose every graph was dropped is not reused."""
        for B in batch_sizes:
            self.graphs.pop(B, None)
            self.outputs.pop(B, None)
        if not self.graphs:
            self._pool = None
        self.capture(batch_sizes)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            block_tables: torch.Tensor, seq_lens: torch.Tensor, seq_lens_list: list[int] | None = None,
            whole_block_tables: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step for ``n`` rows -> ``[n, V]`` logits (or hidden). Shapes: ids/positions/
        slots/seq_lens ``[n]``, block_tables ``[n, w]`` with ``w <= max_blocks_per_seq``.

        The returned tensor is a view of a static buffer: it is overwritten by the next step.
        """
        n = input_ids.shape[0]
        B = self.bucket_for(n)
        if B is None:  # too many rows: plain eager forward on the caller's tensors
            self.num_eager += 1
            lens = seq_lens_list if seq_lens_list is not None else [int(x) for x in seq_lens.tolist()]
            meta = AttentionMetadata(torch.arange(n + 1, dtype=torch.int32, device=self.device), seq_lens,
                                     slot_mapping, block_tables, self.block_size, [1] * n, lens, has_padding=True,
                                     whole_block_tables=whole_block_tables)
            h = self.model(input_ids, positions, self.kv_caches, meta)
            return self.model.compute_logits(h) if self.output == "logits" else h
        self._load(input_ids, positions, slot_mapping, block_tables, seq_lens, B, whole_block_tables)
        if B in self.graphs:
            self.graphs[B].replay()
            self.num_replays += 1
            return self.outputs[B][:n]
        self.num_eager += 1
        lens = None
        if not self.use_graphs:  # the torch backend needs host lengths, padded rows have length 1
            lens = seq_lens_list if seq_lens_list is not None else [int(x) for x in seq_lens.tolist()]
            lens = list(lens) + [1] * (B - n)
        return self._forward(B, lens)[:n]
