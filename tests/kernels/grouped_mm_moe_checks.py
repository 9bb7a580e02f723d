"""Checks of the grouped-GEMM MoE path (kernels/grouped_mm_moe.py, kernels/triton/moe_combine.py), run by
tests/kernels/test_grouped_mm_moe.py: as plain functions on CPU (torch's grouped GEMM and the torch combine) and on
CUDA, and under ``TRITON_INTERPRET=1`` (``python <this> kernels``: the combine and SwiGLU as Triton kernels).

* ``check_sort``: ``sort_pairs`` == a Python oracle (every pair once, grouped by expert in ascending order, pair
  order kept within an expert; ends = cumulative counts), empty experts included.
* ``check_combine``: the combine (Triton where it runs, else torch) == a float64 loop, with and without the extra row.
* ``check_experts``: ``grouped_mm_experts`` (bf16) == ``moe.grouped_expert_mlp`` in fp32 over the same bf16 inputs
  for routings with empty experts, a hot expert and a token routed twice to one expert; an expert's rows read
  against its neighbour's ends (the sabotage control) fail the same tolerance.
* CUDA only: ``fused_experts`` takes the path from the policy's token threshold (and not below it) and equals the
  Triton grouped path; captured in a CUDA graph, replayed with a new routing == eager (no host sync).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from fused_moe_checks import TOL, _silu_and_mul, routings  # noqa: E402


def check_sort(device) -> None:
    from torchinferno.kernels.grouped_mm_moe import sort_pairs

    g = torch.Generator().manual_seed(1)
    for T, k, E in ((1, 6, 64), (37, 4, 8), (13, 3, 16), (0, 2, 4)):
        ids = torch.randint(0, E, (T, k), generator=g)
        if T > 3:
            ids[:, 0] = torch.where(ids[:, 0] == 1, 0, ids[:, 0])
            ids[ids == 2] = 3  # expert 2 empty
        order, ends = sort_pairs(ids.to(device), E)
        flat = ids.reshape(-1).tolist()
        want = [p for e in range(E) for p in range(len(flat)) if flat[p] == e]
        counts = [flat.count(e) for e in range(E)]
        assert order.tolist() == want, (T, k, E)
        assert ends.dtype == torch.int32 and ends.tolist() == torch.tensor(counts).cumsum(0).tolist()


def check_combine(device, dtype=torch.float32) -> None:
    from torchinferno.kernels.grouped_mm_moe import combine

    g = torch.Generator().manual_seed(2)
    for T, k, D in ((9, 3, 40), (1, 6, 2048), (33, 2, 1500)):
        P = T * k
        y = torch.randn(P, D, generator=g).to(dtype)
        order = torch.randperm(P, generator=g)
        w = torch.rand(T, k, generator=g)
        extra = torch.randn(T, D, generator=g).to(dtype)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(P)
        want = torch.zeros(T, D, dtype=torch.float64)
        for t in range(T):
            for j in range(k):
                want[t] += w[t, j].double() * y[rank[t * k + j]].double()
        for ex in (None, extra):
            got = combine(y.to(device), order.to(device), w.to(device), dtype,
                          None if ex is None else ex.to(device)).cpu()
            ref = want + (0 if ex is None else ex.double())
            err = float((got.double() - ref).abs().max() / ref.abs().max())
            assert got.dtype == dtype and err <= (1e-6 if dtype == torch.float32 else 4e-3), (T, k, D, err)


def _problem(device, T, K, E, D, inter, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(torch.bfloat16)
    gate_up = (torch.randn(E, 2 * inter, D, generator=g) * D**-0.5).to(torch.bfloat16)
    down = (torch.randn(E, D, inter, generator=g) * inter**-0.5).to(torch.bfloat16)
    w = torch.rand(T, K, generator=g)
    tables = {n: t for n, t in routings(T, K, E, g).items() if n != "drop"}
    return [t.to(device) for t in (x, gate_up, down, w)], {n: t.to(device) for n, t in tables.items()}


def _rel(got, want) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


def check_experts(device, T=37, K=4, E=8, D=64, inter=48) -> None:
    from torchinferno.kernels import grouped_mm_moe
    from torchinferno.models.common import moe

    (x, gate_up, down, w), tables = _problem(device, T, K, E, D, inter)
    for name, ids in tables.items():
        got = grouped_mm_moe.grouped_mm_experts(x, ids, w, gate_up, down)
        want = moe.grouped_expert_mlp(x.float(), ids, w, gate_up.float(), down.float(), _silu_and_mul)
        assert got.dtype == torch.bfloat16 and got.shape == (T, D)
        err = _rel(got, want)
        assert err <= TOL[torch.bfloat16], f"{name}: rel err {err:.2e}"
    # sabotage: every expert's rows multiplied by its neighbour's weights must fail the same comparison
    ids = tables["random"]
    real = torch._grouped_mm

    def shifted(a, b, offs):
        return real(a, b.roll(1, dims=0), offs=offs)

    torch._grouped_mm = shifted
    try:
        bad = grouped_mm_moe.grouped_mm_experts(x, ids, w, gate_up, down)
    finally:
        torch._grouped_mm = real
    want = moe.grouped_expert_mlp(x.float(), ids, w, gate_up.float(), down.float(), _silu_and_mul)
    assert _rel(bad, want) > 10 * TOL[torch.bfloat16], "sabotage 'neighbour's weights' passed"


def check_policy(device, T=300, K=6, E=64, D=256, inter=128) -> None:
    """CUDA: ``fused_experts`` takes the grouped-GEMM path from ``grouped_mm_min_tokens`` on, not below, and its
    output == the Triton grouped path's (bf16 tolerance)."""
    from torchinferno.kernels import fused_moe, grouped_mm_moe

    (x, gate_up, down, w), tables = _problem(device, T, K, E, D, inter, seed=3)
    ids = tables["random"]
    calls = []
    real = grouped_mm_moe.grouped_mm_experts
    grouped_mm_moe.grouped_mm_experts = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    try:
        with fused_moe.override_policy(grouped_mm_min_tokens=T + 1):
            triton_path = fused_moe.fused_experts(x, ids, w, gate_up, down)
        assert not calls, "took the grouped-GEMM path below its threshold"
        with fused_moe.override_policy(grouped_mm_min_tokens=T):
            got = fused_moe.fused_experts(x, ids, w, gate_up, down)
        assert calls, "did not take the grouped-GEMM path at its threshold"
    finally:
        grouped_mm_moe.grouped_mm_experts = real
    err = _rel(got, triton_path.float())
    assert err <= TOL[torch.bfloat16], f"grouped GEMM vs Triton path: rel err {err:.2e}"


def check_graph(device, T=256, K=6, E=64, D=256, inter=128) -> None:
    """CUDA: captured once, replayed with new tokens and routing == eager each time (a host sync would fail the
    capture; shapes do not depend on the routing)."""
    from torchinferno.kernels.grouped_mm_moe import grouped_mm_experts

    (x, gate_up, down, w), tables = _problem(device, T, K, E, D, inter, seed=4)
    ids = tables["random"].clone()
    grouped_mm_experts(x, ids, w, gate_up, down)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = grouped_mm_experts(x, ids, w, gate_up, down)
    for seed in (5, 6):
        g = torch.Generator().manual_seed(seed)
        x.copy_(torch.randn(x.shape, generator=g).to(x))
        ids.copy_(torch.randint(0, E, ids.shape, generator=g).to(ids))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, grouped_mm_experts(x, ids, w, gate_up, down)), f"replay {seed} != eager"


def main() -> None:
    import triton_interpreter_checks  # noqa: F401  (interpreter patches; Triton dispatch accepts CPU tensors)

    cpu = torch.device("cpu")
    what = sys.argv[1]
    if what == "kernels":
        check_combine(cpu)
        check_combine(cpu, torch.float16)
        check_experts(cpu)  # the Triton SwiGLU and combine; torch's grouped GEMM on CPU
    print(f"ok {what}")


if __name__ == "__main__":
    main()
