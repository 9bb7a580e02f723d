"""Pipeline placement (``pipeline-v0``): the decoder layers split into ``pp_size`` contiguous stages, one per rank.

Stage ``r`` holds layers ``[start_r, stop_r)`` (``model.model.layers`` keeps only those, renumbered from 0, and
``config.num_hidden_layers`` becomes the stage's count, so the KV cache holds only its layers). Every rank
receives the same batch (the engine runs in lockstep on each); a step runs the stages in turn:

* stage 0 embeds the tokens, runs its layers and sends ``(hidden, residual)`` ``[T, D]`` to stage 1 (what crosses a
  boundary is the family's: deepseek-v4 sends its mHC streams ``[T, n, D]``; see :class:`PreNormStages`);
* stage ``r`` receives them, runs its layers, sends them on; the last stage applies the final norm;
* ``compute_logits``: the last stage computes the logits and broadcasts them, so every rank samples the same
  token. Other stages return placeholder hidden states (zeros) from ``forward``.

Micro-batches: a step of several sequences is cut into up to ``pp_microbatches`` (default ``pp_size``) groups of
whole sequences, balanced by tokens; every stage runs them in order and sends each group's activations on as soon
as it is done (``isend``), so stage ``r + 1`` works on group ``k`` while stage ``r`` works on group ``k + 1``
(GPipe-style forward fill; the last stage's outputs are put back in batch order). Attention only mixes tokens of
one sequence, so a group's result does not depend on the others: the same numbers as one group, up to kernel
rounding. A step of one sequence is one group.

Embedding, final norm and head are replicated on every rank (simple; a stage that does not use them still
holds them). Invariant: every rank gets the last stage's logits, equal to the unsharded model's up to kernel
rounding (the same ops in the same order; a rank's thread count may change GEMM blocking).
"""

from __future__ import annotations

import re
import types
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.parallel.plan import WHOLE, ShardRule

_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\..+)$")


def stage_range(num_layers: int, pp_size: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of stage ``rank``: contiguous, sizes differ by at most one (earlier stages get more)."""
    if num_layers < pp_size:
        raise ConfigError(f"num_hidden_layers={num_layers} is fewer than --pipeline-parallel-size {pp_size}")
    base, extra = divmod(num_layers, pp_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def tensor_rule(name: str, config, pp_size: int, rank: int) -> ShardRule:
    """A layer's tensors are read by its stage only (renumbered to the stage's index); the rest by every rank."""
    m = _LAYER.match(name)
    if m is None:
        return WHOLE
    i = int(m.group(2))
    start, stop = stage_range(config.num_hidden_layers, pp_size, rank)
    if not start <= i < stop:
        return ShardRule(skip=True)
    return ShardRule(rename=f"{m.group(1)}{i - start}{m.group(3)}")


def micro_batches(meta, max_groups: int) -> list[tuple[int, int, int, int]]:
    """``(b0, b1, t0, t1)`` per group: sequences ``b0..b1-1`` = flat tokens ``t0..t1-1``; at most ``max_groups``
    contiguous groups of whole sequences with about equal token counts (one group without metadata)."""
    if meta is None or max_groups <= 1 or meta.num_seqs <= 1:
        n = meta.num_tokens if meta is not None else None
        return [(0, meta.num_seqs if meta is not None else 1, 0, n)]
    starts = meta.query_starts_list
    total, groups, b0 = starts[-1], [], 0
    k = min(max_groups, meta.num_seqs)
    for g in range(1, k + 1):
        if g == k:
            b1 = meta.num_seqs
        else:  # the sequence boundary nearest this group's share, leaving one sequence per later group
            want = total * g / k
            b1 = min(range(b0 + 1, meta.num_seqs - (k - g) + 1), key=lambda b: abs(starts[b] - want))
        groups.append((b0, b1, starts[b0], starts[b1]))
        b0 = b1
    return groups


class PreNormStages:
    """How a pre-norm decoder (llama3, deepseek-v3.2, dsv4: ``layer(h, residual, cos, sin, cache, meta)``) splits at
    layer boundaries; a family whose forward differs gives its own object with these methods from
    ``model.pipeline_stages()`` (deepseek-v4: ``HyperStreamStages`` in models/deepseek_v4/model.py).

    * ``begin(input_ids, positions) -> (carry, ctx)``: stage 0's input to its first layer and the per-token context
      every stage needs (here the rotary tables); ``carry`` is what crosses a stage boundary.
    * ``select(carry, ctx, t0, t1)``: both restricted to flat tokens ``t0..t1-1`` (a micro-batch).
    * ``empty_carry(carry)``: buffers to receive a boundary's tensors into, shaped like ``carry`` (on stage 0 the
      residual is ``None`` before the first layer; after any layer it is ``[T, D]``).
    * ``layer(i, module, carry, ctx, kv_cache, meta) -> carry`` and ``end(carry) -> hidden [T, D]`` (last stage).
    """

    def __init__(self, model: nn.Module):
        self.model = model

    def begin(self, input_ids, positions):
        h = self.model.model.embed_tokens(input_ids)  # [T, D]
        cos, sin = self.model.prepare_rope(self.model.rope_cos[positions], self.model.rope_sin[positions], h.dtype)
        return (h, None), (cos, sin)

    def select(self, carry, ctx, t0, t1):
        return tuple(None if c is None else c[t0:t1] for c in carry), (ctx[0][t0:t1], ctx[1][t0:t1])

    def empty_carry(self, carry):
        h = carry[0]
        return torch.empty_like(h), torch.empty_like(h)  # (hidden, residual) [T, D]

    def layer(self, i, module, carry, ctx, kv_cache, meta):
        return module(carry[0], carry[1], ctx[0], ctx[1], kv_cache, meta)

    def end(self, carry):
        return self.model.model.norm(carry[0], carry[1])[0]


def _stages(model: nn.Module):
    hook = getattr(model, "pipeline_stages", None)
    return hook() if hook is not None else PreNormStages(model)


def _forward(self, input_ids, positions, kv_caches=None, attn_meta=None):  # [T] -> [T, D]
    rank, last = self.pp_rank, self.pp_size - 1
    stages = _stages(self)
    carry_all, ctx_all = stages.begin(input_ids, positions)
    groups = micro_batches(attn_meta, self.pp_microbatches)
    self.pp_last_groups = len(groups)
    sends, outs = [], []
    for b0, b1, t0, t1 in groups:
        one = len(groups) == 1
        meta = attn_meta if one else attn_meta.sub_batch(b0, b1)
        carry, ctx = (carry_all, ctx_all) if one else stages.select(carry_all, ctx_all, t0, t1)
        if rank > 0:  # this group's boundary tensors from the previous stage
            carry = stages.empty_carry(carry)
            for t in carry:
                dist.recv(t, src=rank - 1)
        for i, layer in enumerate(self.model.layers):
            carry = stages.layer(i, layer, carry, ctx, None if kv_caches is None else kv_caches[i], meta)
        if rank < last:  # on its way while this stage runs the next group
            carry = tuple(t.contiguous() for t in carry)
            sends += [dist.isend(t, dst=rank + 1) for t in carry]
            outs.append(carry)  # keeps the buffers alive until sent
        else:
            outs.append(stages.end(carry))
    for work in sends:
        work.wait()
    if rank < last:
        return input_ids.new_zeros(input_ids.shape[0], self.config.hidden_size, dtype=self.model.embed_tokens.weight.dtype)
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _compute_logits(self, hidden):  # [N, D] -> [N, V] fp32, the last stage's on every rank
    last = self.pp_size - 1
    if self.pp_rank == last:
        logits = type(self).compute_logits(self, hidden).contiguous()
    else:
        logits = torch.empty(hidden.shape[0], self.full_config.vocab_size, dtype=torch.float32, device=hidden.device)
    if self.pp_size > 1:
        dist.broadcast(logits, src=last)
    return logits


def shard_model(model: nn.Module, pp_size: int, rank: int) -> None:
    """In place, on a ``meta``-built model: keep this stage's layers, run the stage's forward (module doc)."""
    start, stop = stage_range(len(model.model.layers), pp_size, rank)
    model.model.layers = nn.ModuleList(list(model.model.layers)[start:stop])
    model.pp_size, model.pp_rank, model.pp_layers = pp_size, rank, (start, stop)
    model.pp_microbatches, model.pp_last_groups = pp_size, 0  # micro-batches per step (module docstring)
    model.full_config = model.config
    local = {"num_hidden_layers": stop - start}
    for per_layer in ("mlp_layer_types", "layer_types"):  # the stage's slice of per-layer config (its KV spec)
        if getattr(model.config, per_layer, None):
            local[per_layer] = tuple(getattr(model.config, per_layer))[start:stop]
    model.config = replace(model.config, **local)
    model.forward = types.MethodType(_forward, model)
    model.compute_logits = types.MethodType(_compute_logits, model)
    from torchinferno.parallel.plan import disable_fused_steps

    disable_fused_steps(model)
