"""Shared fixtures: tiny random models of every family (built in-process, no files)."""

import pytest
import torch

from torchinferno.models.registry import get_family


def tiny_model(family: str = "llama3", size: str = "debug", seed: int = 0, dtype=torch.float32, variant: str | None = None):
    fam = get_family(family)
    torch.manual_seed(seed)
    kw = {} if variant is None else {"variant": variant}
    m = fam.build(fam.size(size), device="cpu", **kw).to(dtype).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif p.dim() >= 2:
                p.normal_(0, 0.08)
    m.family = fam
    return m


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama3")
