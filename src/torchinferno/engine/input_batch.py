"""Host-side step inputs of the model runner: a persistent block table and one staging copy.

Per step the runner needs, for the scheduled requests in batch order: flattened ``input_ids``
and ``positions [T]``, ``slot_mapping [T]``, ``query_start_loc [B+1]``, ``seq_lens [B]`` and a
block table ``[B, W]``. Rebuilding the table from Python lists every step is O(B * W) Python
work (W = context blocks, ~128 at 2k tokens) and one host tensor per sequence. Instead:

* every live request owns a row of a persistent table ``[max_rows, max_blocks]``; a step writes
  only the blocks appended since the request's previous step and gathers its rows with one
  fancy index;
* positions and slots are computed with numpy from per-request ``(context, query)`` lengths;
* all integers of the step are packed into one int64 host buffer (pinned on CUDA) and moved with
  one non-blocking copy; the device tensors are views of that copy.

Async scheduling: a ``PLACEHOLDER_TOKEN`` in ``token_ids`` stands for the token the previous
step sampled for that request. ``prepare`` writes 0 there on the host and returns the flat
positions (``fill_dst``) and the rows of the previous step's sampled-token tensor (``fill_src``,
from ``prev_rows``) in the same copy; the runner does ``input_ids[fill_dst] =
prev_sampled[fill_src]`` on the device before the forward.

Invariant kept by the engine: ``release`` is called with the ids of every request reported
finished or preempted (``SchedulerOutput.finished_ids`` / ``preempted_ids``) before the next
``prepare``. Between admission and release a request's block list only grows; a row whose
written prefix does not match (``len(block_ids) - len(new_block_ids)``) is rewritten whole, so
admission with prefix-cache hits needs no special case.

Hybrid KV specs (``hybrid=True``): the persistent table holds each request's sliding-group blocks
(``ScheduledRequest.sliding_block_ids``; ``block_tables`` / ``slot_mapping`` address them) and a second one its
whole-group blocks (``block_ids`` -> ``AttentionMetadata.whole_block_tables``). Sliding entries given back behind
the window keep stale ids in the table: no forward reads them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from torchinferno.engine.outputs import ScheduledRequest
from torchinferno.models.common.attention_metadata import AttentionMetadata

__all__ = ["InputBatch", "StepInputs"]


@dataclass
class StepInputs:
    """Device tensors of one step (int64 views of one copy) plus the host lists backends read."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64
    sample_indices: torch.Tensor  # [N] int64: flat index of the last token of each sampling row
    query_start_loc: torch.Tensor  # [B+1] int64
    seq_lens: torch.Tensor  # [B] int64
    block_tables: torch.Tensor  # [B, W] int64
    packed_meta: torch.Tensor  # int64: query_start_loc | seq_lens | block_tables, each 4-element aligned
    sample_rows: list[int]  # [N] batch rows that sample this step
    query_lens_list: list[int]
    seq_lens_list: list[int]
    block_size: int
    fill_dst: torch.Tensor | None = None  # [P] int64 flat token positions holding a placeholder
    fill_src: torch.Tensor | None = None  # [P] int64 rows of the previous step's sampled tokens
    # CPU, one sequence whose blocks are consecutive ids: its first block (the torch attention reads the context
    # as one strided view instead of gathering it block by block); else None
    contiguous_from: int | None = None
    whole_block_tables: torch.Tensor | None = None  # [B, W] int64 (hybrid KV specs): the whole group's table

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    def attention_metadata(self) -> AttentionMetadata:
        """Metadata in the dtypes kernels expect (int32 lengths and table: one cast of ``packed_meta``)."""
        B, W = self.block_tables.shape
        aB1, aB = _align(B + 1), _align(B)
        m = self.packed_meta.to(torch.int32)
        t0 = aB1 + aB
        whole = None
        if self.whole_block_tables is not None:
            whole = m[t0 + _align(B * W) : t0 + _align(B * W) + B * W].view(B, W)
        return AttentionMetadata(
            query_start_loc=m[: B + 1],
            seq_lens=m[aB1 : aB1 + B],
            slot_mapping=self.slot_mapping,
            block_tables=m[t0 : t0 + B * W].view(B, W),
            whole_block_tables=whole,
            block_size=self.block_size,
            query_lens_list=self.query_lens_list,
            seq_lens_list=self.seq_lens_list,
            block_tables_host=None if self.contiguous_from is None else [[self.contiguous_from]],
            contiguous=self.contiguous_from is not None,
        )


class InputBatch:
    """Builds ``StepInputs`` for ``device`` from scheduled requests (see the module docstring).

    ``max_rows`` / ``max_blocks`` are initial sizes (``max_num_seqs``, ``cdiv(max_model_len,
    block_size)``); the table grows if a step ever needs more.
    """

    def __init__(self, block_size: int, device: torch.device | str, max_rows: int = 64, max_blocks: int = 16,
                 hybrid: bool = False):
        self.block_size = block_size
        self.device = torch.device(device)
        self.hybrid = hybrid
        self.table = np.zeros((max(1, max_rows), max(1, max_blocks)), dtype=np.int32)  # [rows, blocks]
        # hybrid: the whole group's table (same shape, same rows); ``table`` then holds the sliding group's
        self.whole = np.zeros_like(self.table) if hybrid else None
        self._written = np.zeros(self.table.shape[0], dtype=np.int64)  # block ids written per row
        self._row_of: dict[str, int] = {}
        self._free_rows = list(range(self.table.shape[0] - 1, -1, -1))  # pop() hands out row 0 first
        self._pinned = self.device.type == "cuda"
        self._host = torch.zeros(0, dtype=torch.long)
        self._host_np = self._host.numpy()
        # Set after each non-blocking copy: the pinned buffer is rewritten only once it completes.
        self._copied = torch.cuda.Event() if self._pinned else None

    # ------------------------------------------------------------------ rows
    @property
    def num_live_rows(self) -> int:
        return len(self._row_of)

    def release(self, request_ids) -> None:
        """Forget the rows of finished or preempted requests (their block lists are gone)."""
        for rid in request_ids:
            row = self._row_of.pop(rid, None)
            if row is not None:
                self._free_rows.append(row)

    def _new_row(self, rid: str) -> int:
        if not self._free_rows:
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            if self.whole is not None:
                self.whole = np.concatenate([self.whole, np.zeros_like(self.whole)])
            self._written = np.concatenate([self._written, np.zeros_like(self._written)])
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        row = self._free_rows.pop()
        self._row_of[rid] = row
        self._written[row] = 0
        return row

    def _sync_row(self, s: ScheduledRequest) -> int:
        """The request's row, with every block of ``s.block_ids`` written."""
        row = self._row_of.get(s.request_id)
        if row is None:
            row = self._new_row(s.request_id)
        nb = len(s.block_ids)
        have = int(self._written[row])
        if nb == have:
            return row
        if nb > self.table.shape[1]:
            grow = np.zeros((self.table.shape[0], max(nb, 2 * self.table.shape[1])), dtype=np.int32)
            grow[:, : self.table.shape[1]] = self.table
            self.table = grow
            if self.whole is not None:
                grow_w = np.zeros_like(grow)
                grow_w[:, : self.whole.shape[1]] = self.whole
                self.whole = grow_w
        start = have if have == nb - len(s.new_block_ids) else 0  # appended blocks only, else the whole row
        if self.whole is None:
            self.table[row, start:nb] = s.block_ids[start:]
        else:
            if s.sliding_block_ids is None or len(s.sliding_block_ids) != nb:
                raise RuntimeError(f"request {s.request_id!r}: a hybrid KV cache needs a sliding block per block")
            self.table[row, start:nb] = s.sliding_block_ids[start:]
            self.whole[row, start:nb] = s.block_ids[start:]
        self._written[row] = nb
        return row

    # ------------------------------------------------------------------ staging
    def _staging(self, n: int) -> np.ndarray:
        """A host int64 buffer of ``n`` elements that no pending copy still reads."""
        if self._copied is not None:
            self._copied.synchronize()
        if self._host.numel() < n:
            size = max(n, 2 * self._host.numel(), 1024)
            self._host = torch.empty(size, dtype=torch.long, pin_memory=self._pinned)
            self._host_np = self._host.numpy()
        return self._host_np[:n]

    def prepare(self, reqs: list[ScheduledRequest], prev_rows: Mapping[str, int] | None = None) -> StepInputs:
        """Inputs of one forward over ``reqs`` (non-empty, batch order).

        ``prev_rows``: request id -> row of the previous step's sampled tokens; needed only when a
        request has a placeholder token (async scheduling).
        """
        B = len(reqs)
        bs = self.block_size
        rows = np.fromiter((self._sync_row(s) for s in reqs), dtype=np.int64, count=B)
        q_list = [len(s.token_ids) for s in reqs]
        q = np.array(q_list, dtype=np.int64)  # [B]
        ctx = np.fromiter((s.num_computed_tokens for s in reqs), dtype=np.int64, count=B)  # [B]
        seq = ctx + q  # [B]
        T = int(q.sum())
        if T == B:  # pure decode: one token per row
            flat = np.fromiter((s.token_ids[0] for s in reqs), dtype=np.int64, count=B)
        else:
            flat = np.fromiter(itertools.chain.from_iterable(s.token_ids for s in reqs), dtype=np.int64, count=T)
            seq_of_tok = np.repeat(np.arange(B), q)  # [T] batch row of each token
        holes = np.flatnonzero(flat < 0)  # placeholders (async scheduling)
        P = int(holes.size)
        if P:
            flat[holes] = 0
            src = self._fill_sources(reqs, holes if T == B else seq_of_tok[holes], prev_rows)
        sample_rows = [i for i, s in enumerate(reqs) if s.sample]
        N = len(sample_rows)
        W = int(-(-int(seq.max()) // bs))

        # Segment starts are multiples of 4 elements, so every view (int64 here, int32 after the
        # metadata cast) is 16-byte aligned like a fresh allocation: Triton kernels specialize on it.
        aT, aN, aP, aB1, aB = _align(T), _align(N), _align(P), _align(B + 1), _align(B)
        fo = 3 * aT + aN  # fill_dst | fill_src (empty without placeholders)
        off = fo + 2 * aP
        WT = _align(B * W) + B * W if self.whole is not None else 0  # hybrid: the whole table after the sliding one
        buf = self._staging(off + aB1 + aB + B * W + WT)
        ids, pos, slots = buf[:T], buf[aT : aT + T], buf[2 * aT : 2 * aT + T]
        sidx = buf[3 * aT : 3 * aT + N]
        ids[:] = flat
        if P:
            buf[fo : fo + P] = holes
            buf[fo + aP : fo + aP + P] = src
        qsl, lens = buf[off : off + B + 1], buf[off + aB1 : off + aB1 + B]
        tables = buf[off + aB1 + aB : off + aB1 + aB + B * W].reshape(B, W)

        if T == B:
            pos[:] = ctx
            tok_rows = rows
        else:
            starts = np.cumsum(q) - q  # [B] first flat token of each row
            pos[:] = np.arange(T) - starts[seq_of_tok] + ctx[seq_of_tok]
            tok_rows = rows[seq_of_tok]
        slots[:] = self.table[tok_rows, pos // bs]
        slots *= bs
        slots += pos % bs
        qsl[0] = 0
        np.cumsum(q, out=qsl[1:])
        lens[:] = seq
        tables[:] = self.table[rows, :W]
        if self.whole is not None:
            w0 = off + aB1 + aB + _align(B * W)
            buf[w0 : w0 + B * W].reshape(B, W)[:] = self.whole[rows, :W]
        if N:
            sidx[:] = qsl[1:][sample_rows] - 1

        host = self._host[: buf.shape[0]]
        if self._pinned:
            dev = host.to(self.device, non_blocking=True)
            self._copied.record(torch.cuda.current_stream(self.device))
        else:  # CPU: views of the staging buffer (read only during this step's forward)
            dev = host
        d_meta = dev[off:]
        return StepInputs(
            input_ids=dev[:T], positions=dev[aT : aT + T], slot_mapping=dev[2 * aT : 2 * aT + T],
            sample_indices=dev[3 * aT : 3 * aT + N], query_start_loc=d_meta[: B + 1], seq_lens=d_meta[aB1 : aB1 + B],
            block_tables=d_meta[aB1 + aB : aB1 + aB + B * W].view(B, W), packed_meta=d_meta, sample_rows=sample_rows,
            query_lens_list=q_list, seq_lens_list=seq.tolist(), block_size=bs,
            fill_dst=dev[fo : fo + P] if P else None, fill_src=dev[fo + aP : fo + aP + P] if P else None,
            whole_block_tables=None if self.whole is None else
            d_meta[aB1 + aB + _align(B * W) : aB1 + aB + _align(B * W) + B * W].view(B, W),
            contiguous_from=int(tables[0, 0]) if B == 1 and not self._pinned and self.whole is None and (W == 1 or bool(
                (np.diff(tables[0]) == 1).all())) else None,
        )

    @staticmethod
    def _fill_sources(reqs: list[ScheduledRequest], batch_rows: np.ndarray,
                      prev_rows: Mapping[str, int] | None) -> list[int]:
        """Row of the previous step's sampled tokens for each placeholder (batch rows ``batch_rows``)."""
        try:
            return [prev_rows[reqs[b].request_id] for b in batch_rows.tolist()]
        except (KeyError, TypeError):
            raise RuntimeError("a placeholder token has no sampled token in the previous step "
                               "(async scheduling needs every step, in order, on this runner)") from None


def _align(n: int) -> int:
    return -(-n // 4) * 4
