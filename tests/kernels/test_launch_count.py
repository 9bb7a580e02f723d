"""Launches of a DeepSeek decode step (bench/launch_count.py), pinned so a lost fusion shows up as a failure.

Under Triton's CPU interpreter the CUDA path runs without a GPU (a ``TRITON_INTERPRET=1`` subprocess,
launch_count_checks.py, an fp16 model so dtype casts count), so the count is that of the fused CUDA step: per MoE
layer of a tiny deepseek-v3 (no query LoRA, the V2-Lite layout) at batch 1: two RMSNorms, three projections, one
MLA prologue (latent norm, both ropes, cache append), two absorb bmms, the decode attention, the router logits and
the routing in one launch (x's cast folded in), and the two per-token expert kernels with the shared experts and the
top-k sum inside: 12 launches (17 before session 12: the router's cast and GEMM, the routing, the sort/pad, two
grouped GEMMs, the top-k sum and its cast; 32 before the fusions of issue 24). At batch 4 the grouped path: the
routing and the sort/pad in one launch, two grouped GEMMs, one sum+cast: 13 (17 before session 12).
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
    lines = {ln.split(" ", 2)[1]: ln.split(" ", 2)[2] for ln in proc.stdout.splitlines() if ln.startswith("ok launches")}
    assert proc.returncode == 0 and {"launches", "launches_b4"} <= set(lines), proc.stderr[-3000:]
    s, s4 = json.loads(lines["launches"]), json.loads(lines["launches_b4"])
    moe, dense = s["ops"]["layer2"], s["ops"]["layer0"]  # tiny debug: layer 0 dense, layers 1-2 MoE
    assert moe.get("triton:_mla_prologue_kernel") == 1 and dense.get("triton:_mla_prologue_kernel") == 1, moe
    # batch 1: per-token expert kernels (shared experts and the top-k sum inside), no sort/pad, router + routing
    assert moe.get("triton:_pair_gate_up_kernel") == 1 and moe.get("triton:_token_down_kernel") == 1, moe
    assert moe.get("triton:_router_route_kernel") == 1 and moe.get("mm") == 3, moe
    moe4 = s4["ops"]["layer2"]  # batch 4: routing + sort/pad in one launch, the grouped GEMMs, sum + cast in one
    assert moe4.get("triton:_moe_gemm_kernel") == 2 and moe4.get("triton:_sum_terms_kernel") == 1, moe4
    assert moe4.get("triton:_router_route_kernel") == 1, moe4
    for layer in (moe, moe4):
        for op in ("cat", "stack", "mul", "add", "sub", "sum", "clone", "copy_", "_to_copy"):
            assert op not in layer, f"unfused {op} in a MoE decode layer: {layer}"
    for layer in (moe, moe4):
        assert not {"triton:_align_kernel", "triton:_route_kernel", "triton:_router_gemv_kernel"} & set(layer), layer
    assert s["per_layer"]["layer2"] <= 12 and s["per_layer"]["layer0"] <= 12, s["per_layer"]
    assert s4["per_layer"]["layer2"] <= 13 and s4["per_layer"]["layer0"] <= 12, s4["per_layer"]
