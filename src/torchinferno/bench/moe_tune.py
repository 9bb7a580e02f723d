"""``tune-moe``: search a small grid of tile configs for the fused MoE GEMMs on the GPU and store the best as data.

For each expert shape ``(E, top_k, D, I)`` and each token count ``T``, both GEMMs (gate_up: ``N = I, K = D``;
down: ``N = D, K = I``) are timed over uniformly random routings with every config of the grid whose row block
fits the rows per expert (CUDA events around graph-free launches, alignment included: a config's ``BLOCK_M`` sets
the padding). The winner per ``(E, N, K, dtype)`` and pair-count bucket (``P = T * top_k``, the ``M`` that
``kernels.fused_moe.config_for`` looks up) is written to ``kernels/triton/fused_moe_configs.json`` (or ``--output``),
merged into what the file already holds. Runs offline, never on the request path.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import torch

from torchinferno.bench.gpu_timing import cuda_time_ms
from torchinferno.kernels import fused_moe

V2_LITE = (64, 6, 2048, 1408)  # E, top_k, D, I
V3 = (256, 8, 7168, 2048)
DEFAULT_TOKENS = (1, 8, 64, 256, 2048)


# Prefill-sized row blocks (>= 128 rows an expert): deeper pipelines and a 256-wide N tile on top of the base grid
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). run 51: the 2048-token prefill's grouped GEMMs ran at ~62% of
# the matmul rate with the base grid's 3-stage tiles.
PREFILL_EXTRA = ((64, 128, 64, 4, 4), (64, 128, 64, 8, 4), (128, 128, 64, 8, 4), (128, 64, 64, 8, 4),
                 (64, 256, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 8, 5))


def grid(rows_per_expert: float, wide_n: bool = True) -> list[dict]:
    """Candidate tiles: row blocks from 16 up to about twice the rows an expert gets, at least 64 from 128 rows an
    expert on (at most ~30 configs);
    ``wide_n`` False leaves out 256-wide N tiles (gate_up: two accumulators, gate and up, per tile)."""
    cap = max(16, min(128, 1 << max(4, int(2 * rows_per_expert - 1).bit_length())))
    out = []
    for bm, bn, bk, warps in itertools.product((16, 32, 64, 128), (32, 64, 128), (64, 128, 256), (4, 8)):
        if bm > cap or (bm == 16 and warps == 8) or (bm == 128 and warps == 4):
            continue
        if rows_per_expert >= 128 and bm < 64:  # prefill: small row blocks only multiply the weight reads
            continue
        if bm > 16 and (bn == 32 or bk == 256):  # narrow / deep tiles only for decode-sized row blocks
            continue
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1 if bm == 16 else 8, "num_warps": warps,
                    "num_stages": 4 if bm <= 32 else 3})
    if rows_per_expert >= 128:
        out += [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w, "num_stages": st}
                for bm, bn, bk, w, st in PREFILL_EXTRA if wide_n or bn < 256]
    return out


def _time_gemm(which: str, cfg: dict, x, ids, w, gate_up, down, act) -> float:
    """Milliseconds of one grouped GEMM launch; the sort/pad (the same for every tile of one ``BLOCK_M``, and in the
    model computed once for both GEMMs) is done before the timed calls."""
    from torchinferno.kernels.triton import fused_moe as tk

    E, top_k = gate_up.shape[0], ids.shape[1]
    sp, be, n = fused_moe.align_pairs(ids, E, cfg["BLOCK_M"])

    def run():
        if which == "gate_up":
            return tk.moe_gate_up(x, gate_up, sp, be, n, top_k, cfg)
        return tk.moe_down(act, down, w, sp, be, n, cfg, zero=False)

    return cuda_time_ms(run, iters=10, warmup=2)


def tune_shape(E: int, top_k: int, D: int, inter: int, tokens=DEFAULT_TOKENS, dtype=torch.bfloat16,
               deadline: float | None = None, log=print) -> dict:
    """-> {config_key: {str(pair bucket): config}} for the two GEMMs of this shape."""
    dev = torch.device("cuda")
    gate_up = torch.randn(E, 2 * inter, D, device=dev, dtype=dtype) * D**-0.5
    down = torch.randn(E, D, inter, device=dev, dtype=dtype) * inter**-0.5
    out: dict = {fused_moe.config_key(E, inter, D, dtype): {}, fused_moe.config_key(E, D, inter, dtype): {}}
    for T in tokens:
        if deadline is not None and time.perf_counter() > deadline:
            log(f"  budget spent: stopping before T={T}")
            break
        P = T * top_k
        x = torch.randn(T, D, device=dev, dtype=dtype)
        ids = torch.stack([torch.randperm(E, device=dev)[:top_k] for _ in range(T)])  # distinct experts per token
        w = torch.rand(P, device=dev)
        act = torch.randn(P, inter, device=dev, dtype=dtype)
        for which, key in (("gate_up", fused_moe.config_key(E, inter, D, dtype)),
                           ("down", fused_moe.config_key(E, D, inter, dtype))):
            best, best_ms = None, float("inf")
            for cfg in grid(P / E, wide_n=which == "down"):
                if best is not None and deadline is not None and time.perf_counter() > deadline:
                    break  # budget spent: keep the best of the configs timed so far
                try:
                    ms = _time_gemm(which, cfg, x, ids, w, gate_up, down, act)
                except Exception as e:  # noqa: BLE001 - a config that does not compile/fit is skipped
                    log(f"    skip {cfg}: {type(e).__name__}")
                    continue
                if ms < best_ms:
                    best, best_ms = cfg, ms
            default_ms = _time_gemm(which, fused_moe.default_config(P, E, 0, 0), x, ids, w, gate_up, down, act)
            out[key][str(fused_moe.m_bucket(P))] = best
            log(f"  E={E} top{top_k} D={D} I={inter} T={T:5d} {which:7s}: best {best_ms * 1e3:8.1f} us "
                f"(default {default_ms * 1e3:8.1f} us) {best}")
    return out


def run_tune_moe(shapes=(V2_LITE,), tokens=DEFAULT_TOKENS, output: str | None = None, budget_s: float = 240.0,
                 log=print) -> dict:
    if not torch.cuda.is_available():
        from torchinferno.errors import ConfigError

        raise ConfigError("tune-moe needs a CUDA device (none is visible here)")
    path = Path(output) if output else fused_moe.CONFIG_FILE
    table = json.loads(path.read_text()) if path.exists() else {}
    deadline = time.perf_counter() + budget_s
    for E, top_k, D, inter in shapes:
        for key, rows in tune_shape(E, top_k, D, inter, tokens, deadline=deadline, log=log).items():
            table.setdefault(key, {}).update({k: v for k, v in rows.items() if v is not None})
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    fused_moe._stored_configs.cache_clear()
    log(f"wrote {path}")
    return table
