"""Helpers for tests and experiments: tiny random models of any family, built in-process."""

from __future__ import annotations

import torch

from torchinferno.models.registry import get_family


def tiny_model(family: str = "llama3", size: str = "debug", seed: int = 0, dtype: torch.dtype = torch.float32,
               variant: str | None = None, device: str = "cpu"):
    """A randomly initialized model of a named size (default ``debug``), with ``.family`` set.

    Norm weights are drawn in [0.5, 1.5] and matrices from N(0, 0.08) so that a missed or
    mis-mapped tensor changes the logits (ones/zeros would hide it).
    """
    fam = get_family(family)
    torch.manual_seed(seed)
    kw = {} if variant is None else {"variant": variant}
    m = fam.build(fam.size(size), device=device, **kw).to(dtype).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif p.dim() >= 2:
                p.normal_(0, 0.08)
    m.family = fam
    return m
