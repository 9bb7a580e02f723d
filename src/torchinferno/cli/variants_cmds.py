"""``validate-model-variants``: every built-in variant of every family checked against its v0.

(``model-variants``, the listing with lineage and promoted variants, is in ``cli/profile_cmds.py``.)

``validate-model-variants`` builds, for every family and every non-v0 variant, v0 and the
variant on the family's tiny ``debug`` config with the same random weights, runs the same
ragged batch through prefill + a few cached decode steps (the variant is fed v0's tokens, so a
flipped argmax cannot hide or cause a difference) and compares all logits. The error measure is
``max|variant - v0| / max|v0|`` (scale-free); a variant passes when it is ``<= --rtol``.
Promoted variants (``--registry``, default ``<cache dir>/promoted_variants.json``) are checked the
same way, built through ``family.build(variant=NAME)``; one whose ops-module override cannot be
loaded (so it would run as its parent) is a failed row.

The helpers ``randomize``, ``cached_decode`` and ``full_forward`` are shared with the bring-up
smokes (``cli/deepseek_cmds.py``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from torchinferno.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    # ``model-variants`` (listing, lineage, promoted rows) lives in cli/profile_cmds.py.
    p = sub.add_parser("validate-model-variants",
                       help="check every non-v0 variant against v0 (same weights, prefill + cached decode logits)")
    p.add_argument("--family", default=None, help="one family (default: every registered family)")
    p.add_argument("--variant", default=None, help="one variant (default: every non-v0 variant)")
    p.add_argument("--rtol", type=float, default=1e-3, help="max |variant - v0| / max |v0| (default 1e-3)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--decode-steps", type=int, default=3)
    p.add_argument("--json-output", default=None, metavar="P", help="also write the results as JSON to P")
    p.add_argument("--registry", default=None, help="promoted-variant JSON (default: <cache dir>/promoted_variants.json)")
    p.add_argument("--include-tensor-parallel", action="store_true",
                   help="also check the parallel variants (tp-v0, pipeline-v0): their parent sharded over spawned gloo "
                        "ranks vs one device (logits within --rtol, greedy and seeded tokens equal on every rank)")
    p.set_defaults(func=cmd_validate_model_variants)


# ------------------------------------------------------------------------ shared checking helpers


def randomize(model: torch.nn.Module, seed: int = 0, score_bias: bool = True) -> torch.nn.Module:
    """Seeded random weights that make a mis-mapped or skipped tensor visible in the logits.

    Norm weights in [0.5, 1.5], matrices N(0, 0.08); MoE correction biases (when present and
    ``score_bias``) in [-0.3, 0.3] so bias-steered selection is exercised.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
        if score_bias:
            for n, b in model.named_buffers():
                if n.endswith("e_score_correction_bias"):
                    b.copy_(torch.rand(b.shape, generator=g) * 0.6 - 0.3)
    return model


@dataclass
class DecodeTrace:
    logits: list[torch.Tensor]  # per row: [prompt_len + steps - 1, V] fp32, one row per fed token
    tokens: list[list[int]]  # per row: the ``steps`` tokens produced (or forced)


def _block_tables(lengths: list[int], cache_backend: str, block_size: int, seed: int):
    """(block_size, tables, num_blocks): dense = one block per row; paged = shuffled small blocks."""
    if cache_backend == "dense":
        bs = max(lengths)
        return bs, [[b] for b in range(len(lengths))], len(lengths)
    if cache_backend != "paged":
        raise ConfigError(f"unknown cache backend '{cache_backend}' (valid: dense, paged)")
    need = [-(-n // block_size) for n in lengths]
    perm = torch.randperm(sum(need), generator=torch.Generator().manual_seed(seed)).tolist()
    tables, start = [], 0
    for n in need:
        tables.append(perm[start : start + n])
        start += n
    return block_size, tables, sum(need)


@torch.inference_mode()
def cached_decode(model, prompts: list[list[int]], steps: int, cache_backend: str = "paged", block_size: int = 4,
                  forced: list[list[int]] | None = None, forward=None, seed: int = 0) -> DecodeTrace:
    """Prefill all prompts as one ragged batch, then ``steps - 1`` batched decode steps, through
    the family's cache (``kv_spec``). Greedy unless ``forced`` gives the tokens to feed back.
    ``forward`` replaces ``model.__call__`` (e.g. a ``torch.compile``d forward)."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for

    fwd = model if forward is None else forward
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    B = len(prompts)
    bs, tables, nblocks = _block_tables([len(p) + steps for p in prompts], cache_backend, block_size, seed)
    caches = model.family.kv_spec(model.config).allocate(nblocks, bs, dtype, device)
    out: list[list[torch.Tensor]] = [[] for _ in range(B)]
    toks: list[list[int]] = [[] for _ in range(B)]
    qlens, ctx = [len(p) for p in prompts], [0] * B
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=device)
    for step in range(steps):
        meta = build_attention_metadata(qlens, ctx, tables, bs, device)
        logits = model.compute_logits(fwd(ids, positions_for(qlens, ctx, device), caches, meta)).float().cpu()
        nxt = []
        for b, part in enumerate(logits.split(qlens)):
            out[b].append(part)
            t = forced[b][step] if forced is not None else int(part[-1].argmax())
            toks[b].append(t)
            nxt.append(t)
        ctx = [c + q for c, q in zip(ctx, qlens)]
        qlens = [1] * B
        ids = torch.tensor(nxt, dtype=torch.long, device=device)
    return DecodeTrace([torch.cat(o) for o in out], toks)  # rows: prompt + steps - 1 fed tokens


@torch.inference_mode()
def full_forward(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Plain causal forward of each sequence alone (no cache): logits [len, V] fp32 per sequence."""
    device = next(model.parameters()).device
    res = []
    for s in seqs:
        ids = torch.tensor(s, dtype=torch.long, device=device)
        res.append(model.compute_logits(model(ids, torch.arange(len(s), device=device))).float().cpu())
    return res


def rel_error(got: list[torch.Tensor], ref: list[torch.Tensor]) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|) over lists of same-shaped tensors."""
    abs_err = max(float((a - b).abs().max()) for a, b in zip(got, ref))
    scale = max(float(b.abs().max()) for b in ref) or 1.0
    return abs_err, abs_err / scale


def random_prompts(vocab: int, batch_size: int, prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    """Ragged prompts (lengths prompt_tokens, prompt_tokens-1, prompt_tokens-2, ...; at least 1)."""
    g = torch.Generator().manual_seed(seed)
    lens = [max(1, prompt_tokens - (b % 3)) for b in range(batch_size)]
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


# ------------------------------------------------------------------------ variant tables


def _families(name: str | None) -> list[str]:
    from torchinferno.models.registry import family_names, get_family

    return [get_family(name).name] if name is not None else family_names()


def _variants(family: str, registry=None) -> dict:
    """The family's built-in VARIANTS plus its promoted variants (from ``registry`` or the default file)."""
    from torchinferno.workbench.promotion import all_variants

    return all_variants(family, registry)


def _table(rows: list[dict], cols: list[str]) -> str:
    cells = [[str("" if r.get(c) is None else r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


# ------------------------------------------------------------------------ validate-model-variants


def validate_variant(family: str, variant: str, rtol: float, device: str = "cpu", steps: int = 3, seed: int = 0,
                     registry=None) -> dict:
    """Compare ``variant`` against v0 of ``family`` on the debug config (see the module docstring)."""
    import warnings

    from torchinferno.models.promoted import using_registry
    from torchinferno.models.registry import get_family

    fam = get_family(family)
    v = _variants(fam.name, registry)[variant]
    row = {"family": fam.name, "variant": variant, "parent": v.parent, "status": v.status, "rtol": rtol}
    t0 = time.perf_counter()
    try:
        config = fam.size("debug")
        ref = randomize(fam.build(config, device="cpu", variant="v0"), seed).to(device).eval()
        ref.family = fam
        with using_registry(registry), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cand = fam.build(config, device="cpu", variant=variant)
        if v.status == "promoted":
            fell_back = [str(w.message) for w in caught if "cannot load its override" in str(w.message)]
            if fell_back:
                raise RuntimeError(fell_back[0])
            got_ops = getattr(cand, "ops", None)
            if got_ops is not None and getattr(got_ops, "__name__", None) != v.ops_module:
                raise RuntimeError(f"built ops module {getattr(got_ops, '__name__', got_ops)}, record names {v.ops_module}")
        cand.load_state_dict(ref.state_dict())
        cand = cand.to(device).eval()
        cand.family = fam
        prompts = random_prompts(config.vocab_size, 3, 12, seed)
        want = cached_decode(ref, prompts, steps)
        got = cached_decode(cand, prompts, steps, forced=want.tokens)
        abs_err, rel = rel_error(got.logits, want.logits)
        row.update(max_abs_err=abs_err, rel_err=rel, ok=bool(rel <= rtol))
    except Exception as e:  # a broken variant is a failed row, not a crashed command
        row.update(max_abs_err=None, rel_err=None, ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def validate_tensor_parallel(variants: list, rtol: float) -> list[dict]:
    """Rows for parallel variants ``(family, name, Variant)`` (tp-v0, pipeline-v0): the parent on
    ``Variant.parallel`` spawned gloo ranks (one world per size and mode) vs one device
    (``parallel.checks.tp_report``)."""
    from torchinferno.parallel.checks import tp_report

    rows = []
    for tp, mode in sorted({v.parallel for _, _, v in variants}):
        group = [(fam, name, v) for fam, name, v in variants if v.parallel == (tp, mode)]
        t0 = time.perf_counter()
        try:
            report = tp_report([(fam, v.parent) for fam, _, v in group], tp, mode=mode)
        except Exception as e:  # noqa: BLE001  (a world that fails is failed rows, not a crashed command)
            report = [{"max_abs_err": None, "rel_err": None, "mismatch": f"{type(e).__name__}: {e}"} for _ in group]
        secs = round((time.perf_counter() - t0) / len(group), 3)
        for (fam, name, v), r in zip(group, report):
            ok = r["rel_err"] is not None and r["rel_err"] <= rtol and not r["mismatch"]
            row = {"family": fam, "variant": name, "parent": v.parent, "status": v.status, "rtol": rtol,
                   "max_abs_err": r["max_abs_err"], "rel_err": r["rel_err"], "ok": ok, "seconds": secs,
                   "tensor_parallel" if mode == "tensor" else "pipeline_parallel": tp}
            if r["mismatch"]:
                row["error"] = r["mismatch"]
            rows.append(row)
    return rows


def cmd_validate_model_variants(a) -> int:
    from torchinferno.cli.common import check_device

    check_device(a.device)
    if a.rtol <= 0:
        raise ConfigError(f"--rtol must be positive, got {a.rtol}")
    if a.decode_steps < 1:
        raise ConfigError(f"--decode-steps must be >= 1, got {a.decode_steps}")
    rows, tp_rows = [], []
    for fam in _families(a.family):
        vs = _variants(fam, a.registry)
        names = [n for n in vs if vs[n].parent is not None and (a.include_tensor_parallel or not vs[n].parallel[0])]
        if a.variant is not None:
            if a.variant not in vs:
                if a.family is not None:
                    raise ConfigError(f"unknown variant '{a.variant}' for family {fam} (valid: {', '.join(sorted(vs))})")
                continue
            if vs[a.variant].parent is None:
                raise ConfigError(f"variant '{a.variant}' is the reference (v0) itself; pick a child variant")
            names = [a.variant]
        rows += [validate_variant(fam, n, a.rtol, a.device, a.decode_steps, registry=a.registry) for n in names
                 if not vs[n].parallel[0]]
        tp_rows += [(fam, n, vs[n]) for n in names if vs[n].parallel[0]]
    rows += validate_tensor_parallel(tp_rows, a.rtol)
    if not rows:
        raise ConfigError(f"no variant '{a.variant}' in any family ({', '.join(_families(a.family))})")
    shown = [{**r, "result": "PASS" if r["ok"] else "FAIL",
              "max_abs_err": "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.3e}",
              "rel_err": "-" if r["rel_err"] is None else f"{r['rel_err']:.3e}"} for r in rows]
    print(_table(shown, ["family", "variant", "parent", "status", "max_abs_err", "rel_err", "rtol", "result", "seconds", "error"]))
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} variants match v0 within rtol={a.rtol}")
    if a.json_output:
        from pathlib import Path

        from torchinferno.checkpoint.safetensors_io import write_json

        Path(a.json_output).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(a.json_output), {"rtol": a.rtol, "device": a.device, "results": rows, "ok": not failed})
    return 1 if failed else 0
