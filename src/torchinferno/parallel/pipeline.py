"""Pipeline placement (``pipeline-v0``): the decoder layers split into ``pp_size`` contiguous stages, one per rank.

Stage ``r`` holds layers ``[start_r, stop_r)`` (``model.model.layers`` keeps only those, renumbered from 0, and
``config.num_hidden_layers`` becomes the stage's count, so the KV cache holds only its layers). Every rank
receives the same batch (the engine runs in lockstep on each); a step runs the stages in turn:

* stage 0 embeds the tokens, runs its layers and sends ``(hidden, residual)`` ``[T, D]`` to stage 1;
* stage ``r`` receives them, runs its layers, sends them on; the last stage applies the final norm;
* ``compute_logits``: the last stage computes the logits and broadcasts them, so every rank samples the same
  token. Other stages return placeholder hidden states (zeros) from ``forward``.

Embedding, final norm and head are replicated on every rank (simple; a stage that does not use them still
holds them). Stages do not overlap yet: there is one batch in flight, no micro-batches (the issue's overlap
target is not met). Invariant: every rank gets the last stage's logits, equal to the unsharded model's up to
kernel rounding (the same ops in the same order; a rank's thread count may change GEMM blocking).
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


def _forward(self, input_ids, positions, kv_caches=None, attn_meta=None):  # [T] -> [T, D]
    rank, last = self.pp_rank, self.pp_size - 1
    h = self.model.embed_tokens(input_ids)
    cos, sin = self.prepare_rope(self.rope_cos[positions], self.rope_sin[positions], h.dtype)
    residual = None
    if rank > 0:  # hidden and residual of the previous stage
        h = torch.empty_like(h)
        residual = torch.empty_like(h)
        dist.recv(h, src=rank - 1)
        dist.recv(residual, src=rank - 1)
    for i, layer in enumerate(self.model.layers):
        h, residual = layer(h, residual, cos, sin, None if kv_caches is None else kv_caches[i], attn_meta)
    if rank < last:
        dist.send(h.contiguous(), dst=rank + 1)
        dist.send(residual.contiguous(), dst=rank + 1)
        return torch.zeros_like(h)
    h, _ = self.model.norm(h, residual)
    return h


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
    model.full_config = model.config
    local = {"num_hidden_layers": stop - start}
    if getattr(model.config, "mlp_layer_types", None) is not None:
        local["mlp_layer_types"] = tuple(model.config.mlp_layer_types)[start:stop]
    model.config = replace(model.config, **local)
    model.forward = types.MethodType(_forward, model)
    model.compute_logits = types.MethodType(_compute_logits, model)
    from torchinferno.parallel.plan import disable_fused_steps

    disable_fused_steps(model)
