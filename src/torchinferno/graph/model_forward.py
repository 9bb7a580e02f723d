"""The one forward every graph workbench captures: a prefill over a flattened batch of prompts.

Only the family contract is used (``model(input_ids, positions, kv_caches, attn_meta)`` and
``model.compute_logits``), so any family works. The captured function is::

    logits[B, V] = compute_logits(model(input_ids [T], positions [T], None, meta)[last token of each row])

with the attention metadata built once on the host and closed over (it becomes graph constants).
The KV-cache write is not part of the captured graph: a prefill attends only to its own new
tokens, so the hidden states equal those of the cached prefill the generator runs, and the graph
stays a pure function of (input_ids, positions) that can be re-run, sliced and rewritten.
Data-dependent code (MoE routing) is specialized to these inputs in a real-tensor trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import fx, nn

from torchinferno.models.common.attention_metadata import AttentionMetadata, build_attention_metadata


@dataclass
class PrefillInputs:
    prompts: list[list[int]]
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    meta: AttentionMetadata

    @property
    def args(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.input_ids, self.positions)


def prefill_inputs(prompts: list[list[int]], device: str | torch.device = "cpu") -> PrefillInputs:
    lens = [len(p) for p in prompts]
    width = max(lens)
    meta = build_attention_metadata(lens, [0] * len(prompts), [[b] for b in range(len(prompts))], width, device)
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=device)
    pos = torch.cat([torch.arange(n) for n in lens]).to(device)
    return PrefillInputs(prompts, ids, pos, meta)


def prefill_forward(model: nn.Module, inputs: PrefillInputs) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn(input_ids, positions) -> logits [B, V]`` of each row's last prompt token (no cache)."""
    meta = inputs.meta
    last = meta.last_token_indices()

    def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = model(input_ids, positions, None, meta)
        return model.compute_logits(hidden[last])

    return forward


def trace_prefill(model: nn.Module, prompts: list[list[int]], fake: bool = False) -> tuple[fx.GraphModule, PrefillInputs]:
    """Capture the prefill forward of ``model`` on ``prompts`` (stable node ids, module paths)."""
    from torchinferno.graph.capture import trace_with_make_fx

    device = next(model.parameters()).device
    inputs = prefill_inputs(prompts, device)
    gm = trace_with_make_fx(prefill_forward(model, inputs), inputs.args, fake=fake, module=model)
    return gm, inputs
