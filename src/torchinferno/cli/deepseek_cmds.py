"""DeepSeek-style bring-up: checkpoint audit/convert, smokes, known-logit capture/validation.

* ``deepseek-audit CKPT`` / ``dsv4-audit CKPT``: headers only, every tensor vs the target family.
* ``deepseek-convert CKPT OUT`` / ``dsv4-convert CKPT OUT``: sharded safetensors (FP8 dequantized)
  + ``torchinferno_conversion_report.json``; refuses what the target cannot represent.
* ``deepseek-smoke`` / ``dsv4-smoke``: a tiny random model; ``*-hf-smoke CKPT``: a checkpoint.
  Both check prefill + cached decode (dense or paged cache) against a plain causal forward and
  print a one-line verdict with the max error; exit 1 on failure.
* ``text-generate CKPT PROMPT --tokenizer T``: ``generate`` under the name the bring-up docs use.
* ``capture-logits CKPT OUT.json --input-ids ...`` / ``validate-logits CKPT REF.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from torchinferno.errors import CheckpointError, ConfigError

_SMOKE_FAMILIES = {"dsv4": "dsv4", "deepseek": "deepseek-v3.2"}
# relative error bound (max |cached - full| / max |full|) per compute dtype
_SMOKE_RTOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def register(sub: argparse._SubParsersAction) -> None:
    from torchinferno.cli.common import add_model_args, add_sampling_args
    from torchinferno.cli.model_cmds import cmd_generate

    for prefix, target in (("deepseek", "deepseek-v3.2"), ("dsv4", "dsv4")):
        p = sub.add_parser(f"{prefix}-audit", help=f"check a checkpoint's tensors against {target} (headers only)")
        p.add_argument("checkpoint", help="HF-layout directory (config.json + safetensors)")
        p.add_argument("--json", action="store_true", help="print the full report as JSON")
        p.add_argument("--json-output", default=None, metavar="P", help="also write the report to P")
        p.set_defaults(func=cmd_audit, target=target)

        p = sub.add_parser(f"{prefix}-convert", help=f"convert a DeepSeek-style checkpoint to {target} (FP8 dequantized)")
        p.add_argument("checkpoint")
        p.add_argument("out")
        p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="auto: keep stored dtypes, FP8 -> bfloat16")
        p.add_argument("--max-shard-size", default="2GB", help="e.g. 500MB, 2GB, or bytes")
        p.set_defaults(func=cmd_convert, target=target)

        p = sub.add_parser(f"{prefix}-smoke", help=f"tiny random {target}: cached decode vs full causal forward")
        _smoke_args(p)
        p.add_argument("--no-q-lora", action="store_true", help="direct q_proj instead of the query LoRA")
        p.add_argument("--score-bias", action="store_true", help="random MoE correction bias (selection-only)")
        p.add_argument("--seed", type=int, default=0)
        p.set_defaults(func=cmd_smoke, target=target, checkpoint=None)

        p = sub.add_parser(f"{prefix}-hf-smoke", help=f"a {target} checkpoint: cached decode vs full causal forward")
        p.add_argument("checkpoint")
        _smoke_args(p)
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        p.add_argument("--variant", default=None)
        p.add_argument("--seed", type=int, default=0)
        p.set_defaults(func=cmd_smoke, target=target)

    p = sub.add_parser("text-generate", help="complete a prompt with any checkpoint (same as generate)")
    add_model_args(p, positional=False)
    p.add_argument("model", help="registry name, HF dir, .gguf file or hub id")
    p.add_argument("prompt")
    add_sampling_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("capture-logits", help="write the logits of a checkpoint for given input ids (known-logit reference)")
    p.add_argument("checkpoint")
    p.add_argument("out", help="output JSON path")
    p.add_argument("--input-ids", type=int, nargs="+", required=True)
    _load_args(p)
    p.set_defaults(func=cmd_capture_logits)

    p = sub.add_parser("validate-logits", help="compare a checkpoint's logits with a capture-logits reference")
    p.add_argument("checkpoint")
    p.add_argument("reference", help="JSON written by capture-logits")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--json-output", default=None, metavar="P")
    _load_args(p)
    p.set_defaults(func=cmd_validate_logits)


def _smoke_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=12)
    p.add_argument("--new-tokens", type=int, default=6)
    p.add_argument("--cache-backend", default="paged", choices=["dense", "paged"])
    p.add_argument("--block-size", type=int, default=4, help="paged cache block size (default 4: many blocks per row)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model forward (slow to warm up)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")


def _load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--variant", default=None)


# ------------------------------------------------------------------------ audit / convert


def _parse_size(text: str) -> int:
    t = text.strip().upper()
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u) and t[: -len(u)].strip():
            t, mult = t[: -len(u)].strip(), units[u]
            break
    else:
        mult = 1
    try:
        n = int(float(t) * mult)
    except ValueError:
        raise ConfigError(f"invalid size '{text}' (e.g. 500MB, 2GB, 1048576)") from None
    if n <= 0:
        raise ConfigError(f"invalid size '{text}': must be positive")
    return n


def cmd_audit(a) -> int:
    from torchinferno.checkpoint.deepseek_convert import audit_checkpoint

    rep = audit_checkpoint(a.checkpoint, a.target)
    data = rep.to_dict()
    if a.json_output:
        from torchinferno.checkpoint.safetensors_io import write_json

        write_json(Path(a.json_output), data)
    if a.json:
        print(json.dumps(data, indent=2))
        return 0 if rep.ok else 1
    print(rep.summary())
    for title, items, fmt in (
        ("refused", rep.refused, lambda r: f"{r['name']}: {r['reason']}"),
        ("mismatched", rep.mismatched, lambda r: f"{r['name']}: checkpoint {tuple(r['checkpoint'])}, expected {tuple(r['expected'])}"),
        ("unexpected", rep.unexpected, lambda r: f"{r['name']}: {r['reason']}"),
        ("missing", rep.missing, lambda n: n),
        ("skipped", rep.skipped, lambda r: f"{r['name']}: {r['reason']}"),
    ):
        for item in items[:20]:
            print(f"  {title}: {fmt(item)}")
        if len(items) > 20:
            print(f"  {title}: ... {len(items) - 20} more")
    return 0 if rep.ok else 1


def cmd_convert(a) -> int:
    from torchinferno.checkpoint.deepseek_convert import REPORT_FILE, convert_checkpoint

    rep = convert_checkpoint(a.checkpoint, a.out, a.target, dtype=a.dtype, max_shard_bytes=_parse_size(a.max_shard_size))
    print(f"{a.target}-convert OK: {rep['tensors_written']} tensors in {len(rep['shards'])} shard(s), "
          f"{rep['dequantized_fp8']} FP8 dequantized, {len(rep['dropped'])} dropped -> {rep['output']} "
          f"(report: {REPORT_FILE})")
    return 0


# ------------------------------------------------------------------------ smokes


def _compute_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def run_smoke(model, batch_size: int, prompt_tokens: int, new_tokens: int, cache_backend: str, block_size: int = 4,
              compile_backend: str | None = None, seed: int = 0) -> dict:
    """Prefill + cached decode (greedy) vs a plain causal forward of the same tokens."""
    from torchinferno.cli.variants_cmds import cached_decode, full_forward, random_prompts, rel_error

    for name, v in (("--batch-size", batch_size), ("--prompt-tokens", prompt_tokens), ("--new-tokens", new_tokens),
                    ("--block-size", block_size)):
        if v < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if prompt_tokens + new_tokens > model.config.max_position_embeddings:
        raise ConfigError(f"--prompt-tokens + --new-tokens = {prompt_tokens + new_tokens} exceeds the model's "
                          f"max_position_embeddings={model.config.max_position_embeddings}")
    forward = None
    if compile_backend:
        forward = torch.compile(model, backend=compile_backend, dynamic=True)
    prompts = random_prompts(model.config.vocab_size, batch_size, prompt_tokens, seed)
    t0 = time.perf_counter()
    trace = cached_decode(model, prompts, new_tokens, cache_backend, block_size, forward=forward, seed=seed)
    cached_s = time.perf_counter() - t0
    full = full_forward(model, [p + t[:-1] for p, t in zip(prompts, trace.tokens)])
    abs_err, rel = rel_error(trace.logits, full)
    greedy_same = all(torch.equal(f[len(p) - 1 :].argmax(-1), torch.tensor(t)) for f, p, t in zip(full, prompts, trace.tokens))
    rtol = _SMOKE_RTOL.get(_compute_dtype(model), 1e-2)
    return {"ok": bool(rel <= rtol), "max_abs_err": abs_err, "rel_err": rel, "rtol": rtol, "greedy_tokens_match": greedy_same,
            "batch_size": batch_size, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
            "cache_backend": cache_backend, "compile": compile_backend or "off", "cached_seconds": round(cached_s, 3),
            "tokens": trace.tokens}


def _smoke_model(a):
    """The model a smoke runs: tiny random (``*-smoke``) or loaded (``*-hf-smoke CKPT``)."""
    from torchinferno.cli.common import check_device
    from torchinferno.cli.variants_cmds import randomize
    from torchinferno.models.registry import get_family

    check_device(a.device)
    fam = get_family(a.target)
    if a.checkpoint is None:
        config = fam.size("debug")
        if a.no_q_lora:
            config = replace(config, q_lora_rank=None, **({"index_n_heads": 0} if fam.name == "deepseek-v3.2" else {}))
        model = randomize(fam.build(config, device="cpu"), a.seed, score_bias=a.score_bias).to(a.device).eval()
        model.family = fam
        return model, f"tiny random {fam.name}" + (" no-q-lora" if a.no_q_lora else "") + (" score-bias" if a.score_bias else "")
    from torchinferno.checkpoint.auto import load_model_auto
    from torchinferno.checkpoint.safetensors_io import read_config

    ckpt = Path(a.checkpoint).expanduser()
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {ckpt}")
    mt = read_config(ckpt).get("model_type")
    if mt not in fam.hf_model_types:
        cmd = "dsv4-hf-smoke" if fam.name == "dsv4" else "deepseek-hf-smoke"
        raise ConfigError(f"{ckpt} has model_type {mt!r}; {cmd} expects {', '.join(fam.hf_model_types)}")
    model = load_model_auto(ckpt, device=a.device, dtype=a.dtype, variant=a.variant)
    return model, str(ckpt)


def cmd_smoke(a) -> int:
    model, what = _smoke_model(a)
    name = ("dsv4" if model.family.name == "dsv4" else "deepseek") + ("-hf-smoke" if a.checkpoint else "-smoke")
    res = run_smoke(model, a.batch_size, a.prompt_tokens, a.new_tokens, a.cache_backend, a.block_size,
                    a.compile_backend if a.compile else None, a.seed)
    verdict = "PASS" if res["ok"] else "FAIL"
    print(f"{name} {verdict}: max_abs_err={res['max_abs_err']:.3e} rel_err={res['rel_err']:.3e} (rtol {res['rtol']:g}), "
          f"greedy tokens {'match' if res['greedy_tokens_match'] else 'differ'}; {what}, batch={a.batch_size} "
          f"prompt={a.prompt_tokens} new={a.new_tokens} cache={a.cache_backend} device={a.device} compile={res['compile']}")
    return 0 if res["ok"] else 1


# ------------------------------------------------------------------------ known logits


def _load(a):
    from torchinferno.cli.common import check_device
    from torchinferno.checkpoint.auto import load_model_auto

    check_device(a.device)
    return load_model_auto(a.checkpoint, device=a.device, dtype=a.dtype, variant=a.variant)


@torch.inference_mode()
def _logits(model, ids: list[int]) -> torch.Tensor:
    V = model.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise ConfigError(f"input id {bad[0]} is outside the vocabulary (0..{V - 1})")
    if len(ids) > model.config.max_position_embeddings:
        raise ConfigError(f"{len(ids)} input ids exceed max_position_embeddings={model.config.max_position_embeddings}")
    device = next(model.parameters()).device
    t = torch.tensor(ids, dtype=torch.long, device=device)
    return model.compute_logits(model(t, torch.arange(len(ids), device=device))).float().cpu()


def cmd_capture_logits(a) -> int:
    from torchinferno.checkpoint.safetensors_io import read_config

    model = _load(a)
    logits = _logits(model, a.input_ids)
    data = {
        "format": "torchinferno-logits-v1",
        "checkpoint": str(a.checkpoint),
        "model_type": read_config(model.checkpoint_dir).get("model_type"),
        "family": model.family.name,
        "dtype": a.dtype,
        "device": a.device,
        "torch": torch.__version__,
        "input_ids": list(a.input_ids),
        "vocab_size": int(logits.shape[-1]),
        "argmax": logits.argmax(-1).tolist(),
        "logits": logits.tolist(),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data) + "\n", encoding="utf-8")
    print(f"capture-logits: {len(a.input_ids)} positions x {logits.shape[-1]} logits -> {out}")
    return 0


def _read_reference(path: str) -> tuple[list[int], torch.Tensor]:
    from torchinferno.checkpoint.safetensors_io import read_json_object

    p = Path(path)
    data = read_json_object(p, what="reference logits file")
    for key in ("input_ids", "logits"):
        if key not in data:
            raise CheckpointError(f"reference {p} is missing key '{key}'")
    try:
        ref = torch.tensor(data["logits"], dtype=torch.float32)
        ids = [int(i) for i in data["input_ids"]]
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"reference {p}: 'logits' / 'input_ids' are malformed ({e})") from None
    if ref.dim() != 2 or ref.shape[0] != len(ids):
        raise CheckpointError(f"reference {p}: 'logits' has shape {tuple(ref.shape)}, expected [{len(ids)}, vocab]")
    return ids, ref


def cmd_validate_logits(a) -> int:
    ids, ref = _read_reference(a.reference)
    model = _load(a)
    got = _logits(model, ids)
    if got.shape != ref.shape:
        raise CheckpointError(f"reference logits have shape {tuple(ref.shape)}, the model gives {tuple(got.shape)} (vocab mismatch?)")
    diff = (got - ref).abs()
    bound = a.atol + a.rtol * ref.abs()
    bad = diff > bound
    argmax_same = int((got.argmax(-1) == ref.argmax(-1)).sum())
    ok = not bool(bad.any())
    res = {"ok": ok, "max_abs_err": float(diff.max()), "max_rel_err": float((diff / ref.abs().clamp_min(1e-12)).max()),
           "violations": int(bad.sum()), "positions": len(ids), "argmax_agree": argmax_same, "rtol": a.rtol, "atol": a.atol}
    if a.json_output:
        from torchinferno.checkpoint.safetensors_io import write_json

        write_json(Path(a.json_output), res)
    first = ""
    if not ok:
        pos, tok = (int(x) for x in torch.nonzero(bad)[0])
        first = f"; first at position {pos} token {tok}: got {float(got[pos, tok]):.6g}, ref {float(ref[pos, tok]):.6g}"
    print(f"validate-logits {'PASS' if ok else 'FAIL'}: max_abs_err={res['max_abs_err']:.3e}, {res['violations']} value(s) "
          f"outside atol={a.atol:g} + rtol={a.rtol:g}*|ref|, argmax agrees at {argmax_same}/{len(ids)} positions{first}")
    return 0 if ok else 1
