"""DeepSeek-V4 bring-up commands.

* ``deepseek-v4-smoke``: a tiny random model (every constant-initialized tensor randomized): prefill + cached
  decode (paged or dense) vs a plain causal forward, and, when transformers is installed, our prefill logits vs
  transformers' ``DeepseekV4ForCausalLM`` (fp32, eager) on the same weights. One verdict line; exit 1 on failure.
* ``deepseek-v4-hf-smoke CKPT``: the same checks for a checkpoint (either spelling, FP8/MXFP4 dequantized).
* ``deepseek-v4-audit CKPT``: headers only: every tensor mapped to its internal name, unknown / missing listed.
* ``deepseek-v4-convert CKPT OUT``: the release layout (FP8/MXFP4) -> HF-layout safetensors, streaming
  (``checkpoint/deepseek_v4_convert.py``).
* ``prepare-deepseek-v4-kernels MODEL OUT``: the V4 GPU kernels' tile configs, compiled and tuned for the config's
  shapes, into a content-addressed artifact directory (``kernels/v4_artifacts.py``) that ``serve --kernel-artifacts``
  and ``LLM(kernel_artifacts=...)`` only load.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from torchinferno.errors import CheckpointError, ConfigError

_HF_TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def register(sub: argparse._SubParsersAction) -> None:
    from torchinferno.cli.deepseek_cmds import _smoke_args

    p = sub.add_parser("deepseek-v4-smoke", help="tiny random deepseek-v4: cached decode vs full forward, and vs transformers")
    _smoke_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-transformers", action="store_true", help="skip the comparison with transformers")
    p.set_defaults(func=cmd_smoke, checkpoint=None)

    p = sub.add_parser("deepseek-v4-hf-smoke", help="a deepseek-v4 checkpoint: cached decode vs full forward, and vs transformers")
    p.add_argument("checkpoint")
    _smoke_args(p)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-transformers", action="store_true", help="skip the comparison with transformers")
    p.set_defaults(func=cmd_smoke)

    p = sub.add_parser("deepseek-v4-audit", help="check a DeepSeek-V4 checkpoint's tensor names and shapes (headers only)")
    p.add_argument("checkpoint")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("deepseek-v4-convert", help="DeepSeek-V4 release checkpoint (FP8/MXFP4) -> HF-layout safetensors")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"],
                   help="dtype of dequantized FP8/MXFP4 weights (others keep their stored dtype)")
    p.add_argument("--max-shard-size", default="2GB", help="e.g. 500MB, 2GB, or bytes")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("prepare-deepseek-v4-kernels",
                       help="compile + tune the DeepSeek-V4 GPU kernels for a config into a content-addressed "
                            "artifact directory (serve --kernel-artifacts loads it)")
    p.add_argument("model", help="a deepseek_v4 checkpoint directory (its config.json) or a size: "
                                 "debug, small, deepseek-v4-flash")
    p.add_argument("out", help="artifact root: OUT/<key>/manifest.json is written")
    p.add_argument("--tensor-parallel-sizes", default="1", help="comma-separated TP sizes to prepare (e.g. 4,8)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="auto", help="auto (cuda when present), cuda, cuda:N or cpu (defaults only)")
    p.add_argument("--no-tune", action="store_true", help="record the default tiles without timing candidates")
    p.set_defaults(func=cmd_prepare_kernels)


def _model(a):
    from torchinferno.cli.common import check_device
    from torchinferno.models.registry import get_family

    check_device(a.device)
    fam = get_family("deepseek-v4")
    if a.checkpoint is None:
        from torchinferno.models.deepseek_v4.model import randomize_untrained_

        torch.manual_seed(a.seed)
        model = randomize_untrained_(fam.build(fam.size("debug"), device="cpu"), a.seed).to(a.device).eval()
        model.family = fam
        return model, "tiny random deepseek-v4"
    from torchinferno.checkpoint.auto import load_model_auto
    from torchinferno.checkpoint.safetensors_io import read_config

    ckpt = Path(a.checkpoint).expanduser()
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {ckpt}")
    mt = read_config(ckpt).get("model_type")
    if mt not in fam.hf_model_types:
        raise ConfigError(f"{ckpt} has model_type {mt!r}; deepseek-v4-hf-smoke expects deepseek_v4")
    return load_model_auto(ckpt, device=a.device, dtype=a.dtype), str(ckpt)


@torch.inference_mode()
def transformers_error(model, ids: list[int]) -> float | None:
    """max |ours - transformers| of the prefill logits of ``ids`` (same weights, eager); None without transformers."""
    try:
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    except ImportError:
        return None
    fam = model.family
    d = fam.config_to_hf(model.config)
    d.pop("architectures", None)
    hc = DeepseekV4Config(**d)
    hc._attn_implementation = "eager"
    hm = DeepseekV4ForCausalLM(hc).eval()
    hm.load_state_dict({k: v.float().cpu() for k, v in model.state_dict().items()}, strict=False)
    device = next(model.parameters()).device
    t = torch.tensor(ids, device=device)
    ours = model.compute_logits(model(t, torch.arange(len(ids), device=device))).float().cpu()
    ref = hm(torch.tensor([ids]), use_cache=False).logits[0].float()
    return float((ours - ref).abs().max())


def cmd_smoke(a) -> int:
    from torchinferno.cli.deepseek_cmds import run_smoke
    from torchinferno.cli.variants_cmds import random_prompts

    model, what = _model(a)
    name = "deepseek-v4-hf-smoke" if a.checkpoint else "deepseek-v4-smoke"
    res = run_smoke(model, a.batch_size, a.prompt_tokens, a.new_tokens, a.cache_backend, a.block_size,
                    a.compile_backend if a.compile else None, a.seed)
    ok = res["ok"]
    hf = "transformers skipped"
    if not a.no_transformers:
        err = transformers_error(model, random_prompts(model.config.vocab_size, 1, a.prompt_tokens + a.new_tokens, a.seed + 1)[0])
        if err is None:
            hf = "transformers not installed"
        else:
            tol = _HF_TOL.get(next(model.parameters()).dtype, 1e-2)
            ok = ok and err <= tol
            hf = f"vs transformers max_abs_err={err:.3e} (tol {tol:g})"
    print(f"{name} {'PASS' if ok else 'FAIL'}: cached vs full max_abs_err={res['max_abs_err']:.3e} rel_err={res['rel_err']:.3e} "
          f"(rtol {res['rtol']:g}), greedy tokens {'match' if res['greedy_tokens_match'] else 'differ'}; {hf}; {what}, "
          f"batch={a.batch_size} prompt={a.prompt_tokens} new={a.new_tokens} cache={a.cache_backend} device={a.device}")
    return 0 if ok else 1


def audit(ckpt: str | Path) -> dict:
    """Headers only: map each tensor to the internal name a deepseek-v4 model of the checkpoint's config expects."""
    from torchinferno.checkpoint import safetensors_io
    from torchinferno.models.deepseek_v4.weights import canonical_name, expected_shapes

    fam_cfg = safetensors_io.read_config(ckpt)
    from torchinferno.models.deepseek_v4.config import config_from_hf

    config = config_from_hf(fam_cfg)
    index = safetensors_io.tensor_index(ckpt)
    want = expected_shapes(config)
    unknown, bad_shape, quantized, ignored, seen = [], [], 0, 0, set()
    for name, info in index.items():
        if name.endswith((".scale", ".weight_scale_inv")) and name.rsplit(".", 1)[0] + ".weight" in index:
            quantized += 1
            continue
        canon = canonical_name(name)
        if canon is None:
            ignored += 1
            continue
        key = canon if canon in want else _expert_key(canon)
        if key not in want:
            unknown.append(name)
        else:
            seen.add(key)
            scaled = any(name.rsplit(".", 1)[0] + s in index for s in (".scale", ".weight_scale_inv"))
            if key == canon and not scaled and tuple(info.shape) != want[key]:
                bad_shape.append(f"{name} {tuple(info.shape)} (expects {want[key]})")
    missing = sorted(set(want) - seen)
    if config.tie_word_embeddings:
        missing = [m for m in missing if m != "lm_head.weight"]
    return {"checkpoint": str(ckpt), "tensors": len(index), "quantized_pairs": quantized, "ignored": ignored,
            "unknown": unknown, "missing": missing, "bad_shape": bad_shape, "ok": not (unknown or missing or bad_shape)}


def _expert_key(canon: str) -> str:
    import re

    m = re.match(r"^(.*\.experts)\.\d+\.(w1|w3|gate_proj|up_proj|w2|down_proj)\.weight$", canon)
    if not m:
        return canon
    return f"{m.group(1)}.{'down_proj' if m.group(2) in ('w2', 'down_proj') else 'gate_up_proj'}"


def cmd_audit(a) -> int:
    rep = audit(a.checkpoint)
    if a.json:
        print(json.dumps(rep, indent=2))
    else:
        print(f"deepseek-v4-audit {'OK' if rep['ok'] else 'FAIL'}: {rep['tensors']} tensors, {rep['quantized_pairs']} "
              f"quantized scales, {rep['ignored']} ignored (MTP), {len(rep['unknown'])} unknown"
              f"{' e.g. ' + rep['unknown'][0] if rep['unknown'] else ''}, {len(rep['missing'])} missing"
              f"{' e.g. ' + rep['missing'][0] if rep['missing'] else ''}, {len(rep['bad_shape'])} of the wrong shape"
              f"{' e.g. ' + rep['bad_shape'][0] if rep['bad_shape'] else ''}")
    return 0 if rep["ok"] else 1


def cmd_convert(a) -> int:
    from torchinferno.checkpoint.auto import resolve_dtype
    from torchinferno.checkpoint.deepseek_v4_convert import REPORT_FILE, convert_release
    from torchinferno.cli.deepseek_cmds import _parse_size

    rep = convert_release(a.checkpoint, a.out, resolve_dtype(a.dtype), _parse_size(a.max_shard_size))
    print(f"deepseek-v4-convert OK: wrote {rep['output']}: {rep['tensors_written']} tensors ({a.dtype} where "
          f"dequantized), {rep['dequantized']} FP8/MXFP4 dequantized, {len(rep['dropped'])} dropped (MTP); "
          f"report {REPORT_FILE}")
    return 0


def _v4_config(model: str):
    from torchinferno.models.registry import get_family

    fam = get_family("deepseek-v4")
    if model in fam.sizes:
        return fam.size(model)
    ckpt = Path(model).expanduser()
    if not (ckpt / "config.json").is_file():
        raise ConfigError(f"{model!r} is neither a checkpoint directory with config.json nor a size "
                          f"({', '.join(fam.sizes)})")
    return fam.config_from_hf(json.loads((ckpt / "config.json").read_text()))


def cmd_prepare_kernels(a) -> int:
    from torchinferno.kernels import v4_artifacts

    try:
        tps = tuple(int(x) for x in a.tensor_parallel_sizes.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--tensor-parallel-sizes: expected comma-separated integers, got {a.tensor_parallel_sizes!r}") from None
    if not tps:
        raise ConfigError("--tensor-parallel-sizes: give at least one size")
    cfg = _v4_config(a.model)
    out = v4_artifacts.prepare(cfg, a.out, getattr(torch, a.dtype), tps, a.device, tune=not a.no_tune)
    man = json.loads((out / v4_artifacts.MANIFEST).read_text())
    print(f"prepare-deepseek-v4-kernels OK: {out} ({len(man['configs'])} shape(s), "
          f"{'tuned on ' + man['device'] if man['tuned'] else 'default tiles'}; torch {man['torch']}, "
          f"triton {man['triton']})")
    return 0
