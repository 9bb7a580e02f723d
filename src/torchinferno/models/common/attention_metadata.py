"""Explicit attention metadata for one forward over a flattened ragged batch.

Built by the caller (generation loop, engine runner) on the host and passed to the model as
an argument. Device tensors are what kernels read; the ``*_list`` host copies let the torch
reference backend slice without device syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Where each sequence's tokens are and where their KV lives.

    Invariants: ``query_start_loc[0] == 0``, ``query_start_loc[-1] == T``;
    ``seq_lens[b] >= query_lens[b]`` (context before this step + new tokens);
    ``slot_mapping[t] = block_tables[b, pos // block_size] * block_size + pos % block_size``
    for token ``t`` of sequence ``b`` at position ``pos``, or ``-1`` for a padded token
    whose KV must not be written anywhere.
    """

    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, max_blocks] int32
    block_size: int
    query_lens_list: list[int]
    seq_lens_list: list[int]
    has_padding: bool = False  # some slot_mapping entries are -1 (padded rows of a captured batch)
    block_tables_host: list[list[int]] | None = None  # optional host copy (lets backends slice views)
    # One sequence whose context blocks are consecutive ids from block_tables_host[0][0]: its tokens are one
    # contiguous run of the cache, so the torch backend reads them as a view (no gather)
    contiguous: bool = False
    # Hybrid KV specs (``KVSpec.is_hybrid``): the block table [B, max_blocks] of the whole-sequence group; the
    # fields above (``block_tables``, ``slot_mapping``) then address the sliding group, whose entries before
    # the window are placeholders that must never be read. None: one group, ``block_tables`` addresses everything.
    whole_block_tables: torch.Tensor | None = None
    # A whole-step CUDA graph's static buffers (``kernels.cuda_graphs_mixed``): the tensors are padded to as many
    # sequences as token rows (``T``); rows past the live tokens belong to no sequence (slot -1), sequences past the
    # live ones hold no tokens (``query_start_loc`` repeats the live token count, ``seq_lens`` 0). The host lists
    # describe the live sequences only (nothing while a graph is captured): a backend that takes this layout must
    # read the device tensors alone.
    graph_padded: bool = False

    @property
    def entry_block_tables(self) -> torch.Tensor:
        """The table of whole-sequence tensors (``whole_block_tables``, else the one table)."""
        return self.block_tables if self.whole_block_tables is None else self.whole_block_tables

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens_list))

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_list) if self.seq_lens_list else 0

    @property
    def is_decode(self) -> bool:
        """Every sequence adds exactly one token (the batched decode fast path); True when empty.

        Read by every attention layer of every step: ``max`` runs in C, a generator would not
        (query lengths are >= 1, so a maximum of 1 means all are 1)."""
        q = self.query_lens_list
        return not q or max(q) == 1

    def decode_row(self, b: int, token: int | None = None) -> "AttentionMetadata":
        """The metadata of sequence ``b`` of a decode batch on its own (one query token); ``token``: the flat
        index of that sequence's one query token when the batch also holds prompts (default ``b``)."""
        t = b if token is None else token
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:2] - self.query_start_loc[0] if b == 0 and t == 0 else
            torch.tensor([0, 1], dtype=self.query_start_loc.dtype, device=self.query_start_loc.device),
            seq_lens=self.seq_lens[b : b + 1], slot_mapping=self.slot_mapping[t : t + 1],
            block_tables=self.block_tables[b : b + 1], block_size=self.block_size, query_lens_list=[1],
            seq_lens_list=[self.seq_lens_list[b]], has_padding=self.has_padding,
            block_tables_host=None if self.block_tables_host is None else [self.block_tables_host[b]],
            whole_block_tables=None if self.whole_block_tables is None else self.whole_block_tables[b : b + 1],
        )

    def sub_batch(self, b0: int, b1: int) -> "AttentionMetadata":
        """The metadata of sequences ``b0..b1-1`` on their own: their tokens are flat indices
        ``query_starts_list[b0]..query_starts_list[b1]-1`` of this batch, renumbered from 0."""
        starts = self.query_starts_list
        t0, t1 = starts[b0], starts[b1]
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[b0 : b1 + 1] - t0, seq_lens=self.seq_lens[b0:b1],
            slot_mapping=self.slot_mapping[t0:t1], block_tables=self.block_tables[b0:b1], block_size=self.block_size,
            query_lens_list=self.query_lens_list[b0:b1], seq_lens_list=self.seq_lens_list[b0:b1],
            has_padding=self.has_padding,
            block_tables_host=None if self.block_tables_host is None else self.block_tables_host[b0:b1],
            whole_block_tables=None if self.whole_block_tables is None else self.whole_block_tables[b0:b1],
        )

    @property
    def query_starts_list(self) -> list[int]:
        """Host copy of ``query_start_loc`` (derived from ``query_lens_list``: no device sync)."""
        out = [0]
        for q in self.query_lens_list:
            out.append(out[-1] + q)
        return out

    def query_spans(self) -> list[tuple[int, int, int]]:
        """Per sequence: (first flat query index, query length, cached context length before them)."""
        return list(zip(self.query_starts_list, self.query_lens_list, self.context_lens_list))

    @staticmethod
    def spans_of(meta: "AttentionMetadata | None", num_tokens: int) -> list[tuple[int, int, int]]:
        """``meta.query_spans()``, or one uncached sequence of ``num_tokens`` when ``meta`` is None."""
        return [(0, num_tokens, 0)] if meta is None else meta.query_spans()

    @property
    def num_leading_decodes(self) -> int:
        """How many sequences at the front add one token each (a mixed step's decodes come first)."""
        return leading_decodes(self.query_lens_list)

    @property
    def context_lens_list(self) -> list[int]:
        return [s - q for s, q in zip(self.seq_lens_list, self.query_lens_list)]

    def last_token_indices(self) -> torch.Tensor:
        """[B] index of each sequence's last new token in the flattened batch."""
        return (self.query_start_loc[1:] - 1).long()


def leading_decodes(query_lens: list[int]) -> int:
    """The length of the leading run of one-token queries in ``query_lens``."""
    nd = 0
    while nd < len(query_lens) and query_lens[nd] == 1:
        nd += 1
    return nd


def build_attention_metadata(
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]] | torch.Tensor,
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Metadata for sequences that add ``query_lens[b]`` tokens after ``context_lens[b]`` cached ones."""
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    if isinstance(block_tables, torch.Tensor):
        bt = block_tables.to(device=device, dtype=torch.int32)
        bt_host = block_tables.cpu()
    else:
        width = max((len(r) for r in block_tables), default=1) or 1
        bt_host = torch.zeros((len(block_tables), width), dtype=torch.int32)
        for i, row in enumerate(block_tables):
            if row:
                bt_host[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        bt = bt_host.to(device)
    slots: list[torch.Tensor] = []
    for b, (c, q) in enumerate(zip(context_lens, query_lens)):
        pos = torch.arange(c, c + q)
        blocks = bt_host[b].long()[pos // block_size]
        slots.append(blocks * block_size + pos % block_size)
    slot_mapping = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    return AttentionMetadata(
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        slot_mapping=slot_mapping.to(device),
        block_tables=bt,
        block_size=block_size,
        query_lens_list=list(query_lens),
        seq_lens_list=seq_lens,
    )


def positions_for(query_lens: list[int], context_lens: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """[T] absolute positions of the new tokens of every sequence, flattened."""
    parts = [torch.arange(c, c + q) for c, q in zip(context_lens, query_lens)]
    return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)).to(device)
