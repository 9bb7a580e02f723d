"""Launches of a DeepSeek decode step (bench/launch_count.py), pinned so a lost fusion shows up as a failure.

Under Triton's CPU interpreter the CUDA path runs without a GPU (a ``TRITON_INTERPRET=1`` subprocess,
launch_count_checks.py), so the count is that of the fused CUDA step: per MoE layer of a tiny deepseek-v3 (no query
LoRA, the V2-Lite layout) two RMSNorms, three projections + the router GEMM, one MLA prologue (latent norm, both
ropes, cache append), two absorb bmms, the decode attention, routing, the sort/pad and two grouped GEMMs with the
shared experts inside, the top-k sum: 15 launches (32 before the fusions of issue 24: 14 for two torch ropes, the
latent concatenation, a separate cache append and latent norm, the shared experts as their own MLP).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from torchinferno.bench.launch_count import count_dispatch, summary

HERE = Path(__file__).resolve().parent


class _Layer(nn.Linear):
    def forward(self, x):
        return super().forward(x).view(2, 4).t().contiguous().t()  # mm, then views (free) and one copy (clone)


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([_Layer(4, 4, bias=False), _Layer(4, 4, bias=False)])

    def forward(self, x):
        for layer in self.model.layers:
            x = layer(x)
        return x.sum()


def test_dispatch_counter_counts_kernels_not_views_per_layer():
    toy = _Toy()
    counts = count_dispatch(toy, lambda: toy(torch.randn(2, 4)))
    s = summary(counts)
    assert s["ops"]["layer0"] == {"mm": 1, "clone": 1} == s["ops"]["layer1"], s
    assert s["ops"]["other"] == {"randn": 1, "sum": 1}, s
    assert s["total"] == sum(s["per_layer"].values())


def test_deepseek_decode_step_launches_on_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(HERE / "launch_count_checks.py")], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ok launches ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    s = json.loads(line.removeprefix("ok launches "))
    moe, dense = s["ops"]["layer2"], s["ops"]["layer0"]  # tiny debug: layer 0 dense, layers 1-2 MoE
    assert moe.get("triton:_mla_prologue_kernel") == 1 and dense.get("triton:_mla_prologue_kernel") == 1, moe
    assert moe.get("triton:_moe_gemm_kernel") == 2 and moe.get("mm") == 4, moe  # shared experts inside the MoE
    for op in ("cat", "stack", "mul", "add", "sub", "clone", "copy_", "_to_copy"):
        assert op not in moe, f"unfused {op} in a MoE decode layer: {moe}"
    assert s["per_layer"]["layer2"] <= 15 and s["per_layer"]["layer0"] <= 12, s["per_layer"]
