"""Fused MoE expert compute: device-side sort/pad of (token, slot) pairs, then two grouped Triton GEMMs.

``fused_experts(x, ids, weights, gate_up, down)`` is the drop-in for ``models.common.moe.grouped_expert_mlp``
(SwiGLU experts) and, with ``limit``, for DeepSeek-V4's clamped experts. Nothing in it reads a tensor value on the
host: shapes depend only on ``T``, ``top_k``, ``E`` and the tile config, so a decode step that calls it can be
captured in a CUDA graph.

Invariants of :func:`align_pairs` (``P = T * top_k`` pairs, ``pair = token * top_k + slot``):

* ``sorted_pairs [P_max]`` int32 lists every pair whose expert is in ``[0, E)`` exactly once, grouped by expert in
  ascending expert order, pairs of one expert in ascending pair order; each expert's run starts at a multiple of
  ``block_m`` and is padded with the sentinel ``P`` to the next multiple; everything past the last run is ``P``.
  Pairs whose expert id is outside ``[0, E)`` are dropped (expert parallelism: another rank's expert).
* ``block_expert [P_max / block_m]`` int32: the expert of each row block, ``-1`` for blocks past the last run.
* ``num_padded [1]`` int32: the used length (sum of the padded runs).
* ``P_max = round_up(P + min(E, P) * (block_m - 1), block_m)`` bounds the used length for any routing.

Tile configs are data: :data:`CONFIG_FILE` maps ``"E,N,K,dtype"`` to ``{M-bucket: config}`` (written by
``torchinferno tune-moe`` on the GPU); :func:`config_for` falls back to :func:`default_config`. Nothing is tuned on
the request path. The same file's ``"policy"`` entry (:class:`MoEPolicy`, :func:`policy`) holds the token thresholds
that pick a path: shared experts inside the fused MoE only up to ``shared_fuse_max_tokens`` tokens (measured on the
H200: a win at one token, a loss from 8 on, 0.95 vs 0.66 ms at 256), and the per-token kernels
(``kernels.triton.moe_small``: no sort/pad, the top-k sum in the down kernel) up to ``small_m_max_tokens``, and
torch's grouped GEMM (``kernels.grouped_mm_moe``) from ``grouped_mm_min_tokens`` on (0: off).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from pathlib import Path

import torch

from torchinferno.kernels import triton as _tri

CONFIG_FILE = Path(__file__).resolve().parent / "triton" / "fused_moe_configs.json"
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def max_padded(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static bound on the padded pair count for any routing of ``num_pairs`` pairs (a multiple of block_m)."""
    bound = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-bound // block_m) * block_m


# Up to here one Triton program sorts/pads; past it four launches. H100 (session 25): at 768 pairs four launches
# took 96-135 us against 104-238 us for one program, at 3,072 pairs 94-99 us against 233-370 us.
ALIGN_KERNEL_MAX_PAIRS = 512


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int):
    """ids [T, top_k] -> (sorted_pairs [P_max] int32, block_expert [P_max / block_m] int32, num_padded [1] int32).

    No host sync, static shapes: on CUDA one Triton launch (``kernels.triton.fused_moe.align_pairs``) for
    decode-sized steps, four (``align_pairs_chunked``: counts per chunk, layout, placement) past
    :data:`ALIGN_KERNEL_MAX_PAIRS`; elsewhere :func:`align_pairs_torch`. All give identical outputs.
    """
    P = ids.numel()
    if P > 0 and _tri.usable(ids):
        from torchinferno.kernels.triton import fused_moe as tk

        align = tk.align_pairs if P <= ALIGN_KERNEL_MAX_PAIRS else tk.align_pairs_chunked
        return align(ids.contiguous(), num_experts, block_m, max_padded(P, num_experts, block_m))
    return align_pairs_torch(ids, num_experts, block_m)


def align_pairs_torch(ids: torch.Tensor, num_experts: int, block_m: int):
    """:func:`align_pairs` as device tensor ops (scatter-add counts, stable argsort, cumsums, searchsorted)."""
    dev = ids.device
    flat = ids.reshape(-1).long()  # [P]
    P, E = flat.numel(), num_experts
    p_max = max_padded(P, E, block_m)
    bucket = torch.where((flat >= 0) & (flat < E), flat, E)  # [P]; E = dropped
    counts = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(0, bucket, torch.ones_like(bucket))
    counts = counts[:E]  # [E] pairs per expert
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = padded.cumsum(0)  # [E]
    pad_start = pad_end - padded
    run_start = counts.cumsum(0) - counts  # [E] first index of each expert in sorted order
    order = torch.argsort(bucket, stable=True)  # [P] pairs by expert, ascending pair id within one
    e_sorted = bucket[order]
    keep = e_sorted < E
    e_safe = e_sorted.clamp(max=E - 1)
    dest = pad_start[e_safe] + torch.arange(P, device=dev) - run_start[e_safe]  # [P] slot in the padded layout
    dest = torch.where(keep, dest, p_max)  # dropped pairs land in a scratch slot past the end
    sorted_pairs = torch.full((p_max + 1,), P, dtype=torch.int32, device=dev)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    used = pad_end[-1:] if E else torch.zeros(1, dtype=torch.long, device=dev)
    block_start = torch.arange(0, p_max, block_m, device=dev)  # [P_max / block_m]
    block_expert = torch.searchsorted(pad_end, block_start, right=True)
    block_expert = torch.where(block_start < used, block_expert, -1).to(torch.int32)
    return sorted_pairs[:p_max], block_expert, used.to(torch.int32)


def reference_align(ids: torch.Tensor, num_experts: int, block_m: int):
    """Python-loop oracle of :func:`align_pairs` (tests only)."""
    flat = ids.reshape(-1).tolist()
    P = len(flat)
    p_max = max_padded(P, num_experts, block_m)
    pairs, blocks = [], []
    for e in range(num_experts):
        mine = [p for p, x in enumerate(flat) if x == e]
        if not mine:
            continue
        n = -(-len(mine) // block_m) * block_m
        pairs += mine + [P] * (n - len(mine))
        blocks += [e] * (n // block_m)
    used = len(pairs)
    pairs += [P] * (p_max - used)
    blocks += [-1] * (p_max // block_m - len(blocks))
    return torch.tensor(pairs, dtype=torch.int32), torch.tensor(blocks, dtype=torch.int32), used


def default_config(M: int, E: int, N: int, K: int) -> dict:
    """Fallback tiles by rows per expert: narrow row blocks at decode sizes, larger ones for prefill."""
    per_expert = M / max(1, E)
    if per_expert <= 2:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
    if per_expert <= 32:
        return {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def config_key(E: int, N: int, K: int, dtype: torch.dtype) -> str:
    return f"{E},{N},{K},{str(dtype).removeprefix('torch.')}"


@functools.lru_cache(maxsize=1)
def _stored_configs() -> dict:
    if not CONFIG_FILE.exists():
        return {}
    return json.loads(CONFIG_FILE.read_text())


@dataclasses.dataclass(frozen=True)
class MoEPolicy:
    """Token thresholds of the fused MoE's paths (the ``"policy"`` entry of :data:`CONFIG_FILE`).

    ``shared_fuse_max_tokens``: a ``SparseMoE`` serves its shared experts inside the fused MoE (ids ``E + j``) for
    at most this many tokens, as its own MLP above (``models.common.moe.fused_shared_count``).
    ``small_m_max_tokens``: :func:`fused_experts` takes the per-token kernels for at most this many tokens (every
    pair reads its expert's weights itself, so past a few tokens the grouped GEMMs read less).
    ``small_m_tiles``: ``{"gate_up": cfg, "down": cfg}`` tiles of those kernels (``BLOCK_N``, ``BLOCK_K``,
    ``num_warps``, ``num_stages``; a down ``BLOCK_K`` of at least ``I`` reads a slot's rows as one tile).
    ``grouped_mm_min_tokens``: from this many tokens on (0: never), :func:`fused_experts` runs torch's grouped GEMM
    over expert-sorted rows (``kernels.grouped_mm_moe``) where it applies, instead of the Triton grouped GEMMs."""

    shared_fuse_max_tokens: int = 4
    small_m_max_tokens: int = 1
    small_m_tiles: dict = dataclasses.field(default_factory=lambda: {
        "gate_up": {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3},
        "down": {"BLOCK_N": 8, "BLOCK_K": 2048, "num_warps": 8, "num_stages": 1}})  # H200 run 57: the V2-Lite-like
    # batch-1 step 1.418 ms device against 1.501 with BLOCK_N 4 (probe_ds_prefill.py decode, step_down_8x2048)
    grouped_mm_min_tokens: int = 0


_POLICY_OVERRIDE: list[MoEPolicy] = []
_POLICY_CACHE: list[tuple[dict, MoEPolicy]] = []  # (the table it was read from, the policy)


def _stored_policy() -> MoEPolicy:
    table = _stored_configs()
    if not _POLICY_CACHE or _POLICY_CACHE[0][0] is not table:  # re-read after _stored_configs.cache_clear()
        raw = table.get("policy") or {}
        known = {f.name for f in dataclasses.fields(MoEPolicy)}
        _POLICY_CACHE[:] = [(table, MoEPolicy(**{k: v for k, v in raw.items() if k in known}))]
    return _POLICY_CACHE[0][1]


def policy() -> MoEPolicy:
    """The path thresholds in force: :func:`override_policy`'s innermost, else the stored ones (defaults when the
    file has no ``"policy"``)."""
    return _POLICY_OVERRIDE[-1] if _POLICY_OVERRIDE else _stored_policy()


@contextlib.contextmanager
def override_policy(**changes):
    """``with override_policy(small_m_max_tokens=0): ...`` (benchmarks' A/Bs and tests; not thread-safe)."""
    _POLICY_OVERRIDE.append(dataclasses.replace(policy(), **changes))
    try:
        yield _POLICY_OVERRIDE[-1]
    finally:
        _POLICY_OVERRIDE.pop()


def m_bucket(M: int) -> int:
    return next((b for b in M_BUCKETS if b >= M), M_BUCKETS[-1])


def config_for(M: int, E: int, N: int, K: int, dtype: torch.dtype) -> dict:
    """Tile config for a GEMM of ``M`` pairs over ``E`` experts of ``[N, K]`` weights: the stored one for the
    nearest M bucket at or above ``M``, else :func:`default_config`."""
    table = _stored_configs().get(config_key(E, N, K, dtype))
    if table:
        b = m_bucket(M)
        keys = sorted(int(k) for k in table)
        pick = next((k for k in keys if k >= b), keys[-1])
        return dict(table[str(pick)])
    return default_config(M, E, N, K)


def fused_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor, limit: float | None = None, configs: tuple[dict, dict] | None = None,
                  may_drop: bool = False, shared: tuple[torch.Tensor, torch.Tensor] | None = None,
                  small: bool | None = None, aligned: tuple | None = None) -> torch.Tensor:
    """x [T, D], ids [T, k], weights [T, k], gate_up [E, 2I, D], down [E, D, I] -> [T, D] in x.dtype.

    ``sum_j weights[t, j] * down[e] @ swiglu(gate_up[e] @ x[t])`` with ``e = ids[t, j]``; with ``limit``:
    ``gate.clamp(max=limit)``, ``up.clamp(-limit, limit)`` (V4). ``may_drop``: ids outside ``[0, E)`` may occur
    and contribute 0 (expert parallelism); without it every id must be in range (a router's output is), which
    spares zero-filling the per-pair output. Triton kernels (``kernels.triton.fused_moe``); ``configs`` =
    (gate_up tiles, down tiles) overrides the table.

    ``shared = (shared_gate_up [2 ns I, D], shared_down [D, ns I])``: the weights of a shared-experts SwiGLU MLP
    (``ns`` shared experts of width ``I`` merged, gate rows first) served by the same two launches as the routed
    ones: ids ``E + j`` (``j < ns``) select shared expert ``j`` (:func:`append_shared`; a router appends them
    with weight 1), so ``down_s @ swiglu(gate_up_s @ x)`` = the sum of its ``ns`` width-``I`` slices. Tile configs
    are looked up by the routed ``E``.

    ``aligned``: :func:`align_pairs`'s output for ``ids`` at the gate_up tiles' ``BLOCK_M`` (computed by the routing
    launch, ``kernels.triton.moe_routing.router_route(align=...)``), so no sort/pad launch here.

    ``small``: the per-token kernels (``kernels.triton.moe_small``: two launches, no sort/pad, the sum over the
    top-k and the cast inside the down kernel); None: for ``0 < T <= policy().small_m_max_tokens`` when no
    ``configs`` are given.

    From ``policy().grouped_mm_min_tokens`` tokens on (when set, and no ``configs`` / ``aligned`` are given), torch's
    grouped GEMM over expert-sorted rows (``kernels.grouped_mm_moe``) where it applies.
    """
    from torchinferno.kernels.triton import fused_moe as tk

    T, top_k = ids.shape
    E, two_i, D = gate_up.shape
    P = T * top_k
    s_gu, s_dn = shared if shared is not None else (None, None)
    n_total = E + (0 if s_gu is None else s_gu.shape[0] // two_i)
    if small is None:
        small = configs is None and 0 < T <= policy().small_m_max_tokens
    if small:
        from torchinferno.kernels.triton import moe_small

        tiles = policy().small_m_tiles
        return moe_small.small_m_experts(x.contiguous(), ids.contiguous(), weights.float().contiguous(), gate_up,
                                         down, tiles["gate_up"], tiles["down"], limit, may_drop, shared)
    if configs is None and aligned is None and 0 < policy().grouped_mm_min_tokens <= T:
        from torchinferno.kernels import grouped_mm_moe

        if grouped_mm_moe.applies(x, gate_up, limit, may_drop, shared):
            return grouped_mm_moe.grouped_mm_experts(x, ids, weights, gate_up, down)
    if configs is None:
        configs = grouped_configs(T, top_k, gate_up, x.dtype)
    x = x.contiguous()
    c1, c2 = configs
    if aligned is not None:
        sp1, be1, n1 = aligned
        assert sp1.numel() == max_padded(P, n_total, c1["BLOCK_M"]), "aligned pairs of another tile size"
    else:
        sp1, be1, n1 = align_pairs(ids, n_total, c1["BLOCK_M"])
    act = tk.moe_gate_up(x, gate_up, sp1, be1, n1, top_k, c1, limit, shared_gate_up=s_gu)  # [P, I]
    sp2, be2, n2 = (sp1, be1, n1) if c2["BLOCK_M"] == c1["BLOCK_M"] else align_pairs(ids, n_total, c2["BLOCK_M"])
    y = tk.moe_down(act, down, weights.reshape(-1).float().contiguous(), sp2, be2, n2, c2, zero=may_drop,
                    shared_down=s_dn)  # [P, D]
    return tk.moe_sum(y, top_k, x.dtype)  # [T, D]: the top-k sum and the cast in one launch


def grouped_configs(T: int, top_k: int, gate_up: torch.Tensor, dtype: torch.dtype) -> tuple[dict, dict]:
    """The (gate_up, down) tiles :func:`fused_experts` uses for ``T`` tokens of ``top_k`` slots (routed + shared)."""
    E, two_i, D = gate_up.shape
    P = T * top_k
    return config_for(P, E, two_i // 2, D, dtype), config_for(P, E, D, two_i // 2, dtype)


def append_shared(weights: torch.Tensor, ids: torch.Tensor, num_routed: int,
                  n_shared: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A router's (weights, ids) [T, k] -> [T, k + ns]: every token also selects the shared experts
    ``E .. E + ns - 1`` with weight 1 (torch ops; ``kernels.triton.moe_routing.route(n_shared=...)`` writes them in
    the routing launch itself)."""
    T = ids.shape[0]
    extra = torch.arange(num_routed, num_routed + n_shared, device=ids.device, dtype=ids.dtype).expand(T, n_shared)
    ones = torch.ones(T, n_shared, dtype=weights.dtype, device=weights.device)
    return torch.cat([weights, ones], 1), torch.cat([ids, extra], 1)


def usable(x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    """The fused path applies: CUDA tensors, Triton present, not tracing, plain dense expert weights in x's dtype."""
    return (_tri.usable(x) and gate_up.dim() == 3 and gate_up.stride(2) == 1 and gate_up.dtype == x.dtype
            and type(gate_up) in (torch.Tensor, torch.nn.Parameter))
