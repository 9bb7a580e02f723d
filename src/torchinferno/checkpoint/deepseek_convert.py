"""Audit and convert DeepSeek-style checkpoints for the ``deepseek-v3.2`` and ``dsv4`` families.

* **audit** reads only ``config.json`` and the safetensors headers (``tensor_index``): the target
  family's model is built on ``meta`` from the config, its HF tensor names and shapes come from
  ``export_weights`` (per-expert layout; the fused 3-D expert layout is accepted too), and every
  checkpoint tensor is classified as matched / mismatched / unexpected / skipped (MTP layers the
  family ignores) / refused (what the target cannot represent), plus every expected tensor the
  checkpoint lacks (missing). FP8 pairs (``X.weight`` float8 + ``X.weight_scale_inv``) are
  checked for presence and scale shape.
* **convert** refuses unless the audit is clean, then streams the tensors (one at a time, FP8
  pairs dequantized with ``checkpoint.fp8``), writes sharded safetensors with the target's
  ``config.json``, copies tokenizer files, and writes ``torchinferno_conversion_report.json``.

Targets: ``deepseek-v3.2`` reads ``deepseek_v3`` / ``deepseek_v32`` configs; ``dsv4`` also
reads them (``config_from_deepseek_hf``) and refuses, by name, the tensors it cannot
represent (the V3.2 indexer, MTP layers, attention biases).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

import torch

from torchinferno.checkpoint import fp8, safetensors_io
from torchinferno.errors import CheckpointError, ConfigError
from torchinferno.models.registry import get_family

REPORT_FILE = "torchinferno_conversion_report.json"
TARGETS = ("deepseek-v3.2", "dsv4")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class AuditReport:
    """What a checkpoint holds relative to a target family (from headers only)."""

    checkpoint: str
    target: str
    source_model_type: str | None
    fp8_block: int
    num_tensors: int = 0
    total_bytes: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)
    fp8_weights: int = 0
    fp8_scales: int = 0
    matched: int = 0
    expected: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[dict] = field(default_factory=list)  # {name, reason}
    mismatched: list[dict] = field(default_factory=list)  # {name, checkpoint, expected}
    skipped: list[dict] = field(default_factory=list)  # {name, reason}: present, not used by the target
    refused: list[dict] = field(default_factory=list)  # {name, reason}: the target cannot represent it

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched or self.refused)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    def summary(self) -> str:
        verdict = "OK" if self.ok else "FAIL"
        return (f"{self.target}-audit {verdict}: {self.num_tensors} tensors ({self.total_bytes / 1e6:.1f} MB), "
                f"matched {self.matched}/{self.expected}, missing {len(self.missing)}, unexpected {len(self.unexpected)}, "
                f"mismatched {len(self.mismatched)}, refused {len(self.refused)}, skipped {len(self.skipped)}, "
                f"fp8 weights {self.fp8_weights} (block {self.fp8_block})")

    def first_problem(self) -> str:
        """One line naming the first problem (and how many more)."""
        probs: list[str] = []
        probs += [f"'{r['name']}' cannot be represented by {self.target} ({r['reason']})" for r in self.refused]
        probs += [f"shape mismatch for tensor '{r['name']}': checkpoint {tuple(r['checkpoint'])}, "
                  f"{self.target} expects {tuple(r['expected'])}" for r in self.mismatched]
        probs += [f"unexpected tensor '{r['name']}' ({r['reason']})" for r in self.unexpected]
        probs += [f"missing tensor '{n}'" for n in self.missing]
        if not probs:
            return ""
        cmd = "dsv4-audit" if self.target == "dsv4" else "deepseek-audit"
        more = f" (+{len(probs) - 1} more problem(s); see {cmd})" if len(probs) > 1 else ""
        return probs[0] + more


# ------------------------------------------------------------------------ target description


def _ckpt_dir(ckpt: str | Path) -> Path:
    p = Path(ckpt).expanduser()
    if not p.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {p}")
    return p


def _fp8_block(hf_config: dict) -> int:
    q = hf_config.get("quantization_config") or {}
    size = q.get("weight_block_size")
    if size is None:
        return fp8.DEFAULT_BLOCK
    if not (isinstance(size, (list, tuple)) and len(size) == 2 and size[0] == size[1] and int(size[0]) > 0):
        raise ConfigError(f"config.json key 'quantization_config.weight_block_size' = {size!r}: only square blocks are supported")
    return int(size[0])


def target_config(target: str, hf_config: dict):
    """(family, typed config) the checkpoint converts to; ConfigError naming the key otherwise."""
    if target not in TARGETS:
        raise ConfigError(f"unknown conversion target '{target}' (valid: {', '.join(TARGETS)})")
    fam = get_family(target)
    if target == "dsv4":
        return fam, fam.extra["config_from_deepseek_hf"](hf_config)
    return fam, fam.config_from_hf(hf_config)


def _expected(fam, config) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[tuple[int, ...], list[str]]]]:
    """(HF name -> shape in the per-expert layout, fused 3-D name -> (shape, per-expert names it covers))."""
    model = fam.build(config, device="meta")
    expected = {n: tuple(t.shape) for n, t in fam.export_weights(model)}
    fused: dict[str, tuple[tuple[int, ...], list[str]]] = {}
    for name, t in model.state_dict().items():
        m = _FUSED.match(name)
        if m and t.dim() == 3:
            base, proj = m.groups()
            projs = ("gate_proj", "up_proj") if proj == "gate_up_proj" else ("down_proj",)
            fused[name] = (tuple(t.shape), [f"{base}.{e}.{p}.weight" for e in range(t.shape[0]) for p in projs])
    return expected, fused


def _skip_or_refuse(target: str, name: str, config) -> tuple[str, str] | None:
    """("skipped" | "refused", reason) for a checkpoint tensor the target does not load, else None."""
    if _IGNORED.search(name):
        return "skipped", "rotary inv_freq buffer (recomputed)"
    if name == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
        return "skipped", "tied to the embedding"
    if target == "dsv4":
        why = get_family("dsv4").extra["refusal_reason"](name, config)
        return ("refused", why) if why else None
    m = _LAYER.match(name)
    if m:
        layer = int(m.group(1))
        if config.num_hidden_layers <= layer < config.num_hidden_layers + config.num_nextn_predict_layers:
            return "skipped", "multi-token-prediction layer (not part of the causal LM forward)"
    return None


# ------------------------------------------------------------------------ audit


def audit_checkpoint(ckpt: str | Path, target: str) -> AuditReport:
    """Classify every tensor of ``ckpt`` against ``target`` from config.json + headers only."""
    d = _ckpt_dir(ckpt)
    hf_config = safetensors_io.read_config(d)
    fam, config = target_config(target, hf_config)
    block = _fp8_block(hf_config)
    index = safetensors_io.tensor_index(d)
    expected, fused = _expected(fam, config)
    rep = AuditReport(str(d), fam.name, hf_config.get("model_type"), block, expected=len(expected))
    rep.num_tensors = len(index)
    rep.total_bytes = sum(i.nbytes for i in index.values())
    rep.dtypes = dict(Counter(i.dtype for i in index.values()))
    covered: set[str] = set()
    for name, info in index.items():
        base = name[: -len(fp8.SCALE_SUFFIX)] if name.endswith(fp8.SCALE_SUFFIX) else None
        if base is not None:  # an FP8 block scale: belongs to its weight
            rep.fp8_scales += 1
            w = index.get(base)
            if w is None:
                rep.unexpected.append({"name": name, "reason": f"block scale without its weight '{base}'"})
            elif not fp8.is_fp8(w.torch_dtype):
                rep.unexpected.append({"name": name, "reason": f"block scale for '{base}', which is {w.dtype}, not FP8"})
            elif len(w.shape) == 2 and tuple(info.shape) != fp8.scale_shape(w.shape, block):
                rep.mismatched.append({"name": name, "checkpoint": list(info.shape),
                                       "expected": list(fp8.scale_shape(w.shape, block))})
            continue
        if fp8.is_fp8(info.torch_dtype):
            rep.fp8_weights += 1
            if name + fp8.SCALE_SUFFIX not in index:
                rep.unexpected.append({"name": name, "reason": f"FP8 ({info.dtype}) without '{name}{fp8.SCALE_SUFFIX}'"})
                continue
        verdict = _skip_or_refuse(fam.name, name, config)
        if verdict is not None:
            kind, why = verdict
            (rep.skipped if kind == "skipped" else rep.refused).append({"name": name, "reason": why})
            continue
        if name in expected:
            want, covers = expected[name], [name]
        elif name in fused:
            want, covers = fused[name]
        else:
            rep.unexpected.append({"name": name, "reason": f"no {fam.name} tensor with that name"})
            continue
        covered.update(covers)  # present (a wrong shape is reported as mismatched, not also as missing)
        if tuple(info.shape) != want:
            rep.mismatched.append({"name": name, "checkpoint": list(info.shape), "expected": list(want)})
            continue
        rep.matched += 1
    rep.missing = [n for n in expected if n not in covered]
    return rep


# ------------------------------------------------------------------------ convert


def _split_fused(name: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    m = _FUSED.match(name)
    if not (m and t.dim() == 3):
        yield name, t
        return
    base, proj = m.groups()
    if proj == "down_proj":
        for e in range(t.shape[0]):
            yield f"{base}.{e}.down_proj.weight", t[e]
    else:
        inter = t.shape[1] // 2
        for e in range(t.shape[0]):
            yield f"{base}.{e}.gate_proj.weight", t[e, :inter]
            yield f"{base}.{e}.up_proj.weight", t[e, inter:]


def convert_checkpoint(ckpt: str | Path, out: str | Path, target: str, dtype: str = "auto",
                       max_shard_bytes: int = 2 * 1024**3) -> dict:
    """Audit, then write ``out`` (config.json, sharded safetensors, tokenizer files, report).

    ``dtype``: ``auto`` keeps each stored dtype and dequantizes FP8 to bfloat16 (the published
    conversion); ``float32`` / ``bfloat16`` / ``float16`` casts every floating tensor.
    Returns the report dict (also written to ``out/torchinferno_conversion_report.json``).
    """
    if dtype != "auto" and dtype not in _DTYPES:
        raise ConfigError(f"unknown dtype '{dtype}' (valid: auto, {', '.join(_DTYPES)})")
    t0 = time.perf_counter()
    src = _ckpt_dir(ckpt)
    out = Path(out).expanduser()
    if out.resolve() == src.resolve():
        raise ConfigError(f"output directory {out} is the checkpoint itself; choose another")
    audit = audit_checkpoint(src, target)
    if not audit.ok:
        raise CheckpointError(f"cannot convert {src} to {audit.target}: {audit.first_problem()}")
    hf_config = safetensors_io.read_config(src)
    fam, config = target_config(target, hf_config)
    if fam.name == "deepseek-v3.2" and config.num_nextn_predict_layers:
        config = replace(config, num_nextn_predict_layers=0)  # MTP layers are dropped below
    drop = {r["name"] for r in audit.skipped}
    cast = _DTYPES.get(dtype)
    pairer = fp8.Fp8Pairer(block=audit.fp8_block, out_dtype=cast or torch.bfloat16)
    written: dict[str, str] = {}

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        kept = ((n, t) for n, t in safetensors_io.iter_tensors(src)
                if n not in drop and n.removesuffix(fp8.SCALE_SUFFIX) not in drop)
        for name, t in pairer(kept):
            if cast is not None and t.is_floating_point():
                t = t.to(cast)
            for out_name, piece in _split_fused(name, t):
                written[out_name] = str(piece.dtype).removeprefix("torch.")
                yield out_name, piece

    out_config = fam.config_to_hf(config)
    safetensors_io.save_hf_dir(out, out_config, stream(), max_shard_bytes=max_shard_bytes,
                               metadata={"torchinferno_converted_from": str(src), "torchinferno_family": fam.name})
    for f in _TOKENIZER_FILES:
        if (src / f).is_file():
            shutil.copyfile(src / f, out / f)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    report = {
        "source": str(src),
        "output": str(out),
        "target_family": fam.name,
        "source_model_type": hf_config.get("model_type"),
        "output_model_type": out_config.get("model_type"),
        "dtype": dtype,
        "tensors_written": len(written),
        "dtypes_written": dict(Counter(written.values())),
        "shards": shards,
        "fp8_block": audit.fp8_block,
        "dequantized_fp8": len(pairer.dequantized),
        "dropped": audit.skipped,
        "seconds": round(time.perf_counter() - t0, 3),
        "audit": audit.to_dict(),
    }
    safetensors_io.write_json(out / REPORT_FILE, report)
    return report


def load_report(out: str | Path) -> dict:
    path = Path(out) / REPORT_FILE
    if not path.is_file():
        raise CheckpointError(f"missing {REPORT_FILE} in {out}")
    return json.loads(path.read_text(encoding="utf-8"))
