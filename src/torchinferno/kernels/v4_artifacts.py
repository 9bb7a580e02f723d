"""Offline preparation of DeepSeek-V4's GPU kernels into a content-addressed artifact directory, and its loading.

:func:`prepare` (the ``prepare-deepseek-v4-kernels`` command) takes a V4 config, a dtype and the tensor-parallel
sizes to serve with, and writes ``OUT/<key>/manifest.json``: per kernel shape (``kernels.sparse_sink_decode``:
local heads, head dim, dtype) the chosen tile config. On CUDA each shape is compiled for every candidate tile and
timed on random data of the config's decode shape (window + top-k rows); elsewhere the defaults are recorded
(``"tuned": false``). ``<key>`` = ``v4k-`` + sha256 over the config's kernel-relevant shapes, the kernel sources
and the torch / triton versions (:func:`artifact_key`), so a changed kernel or toolchain never reads a stale
artifact.

:func:`apply` (``serve --kernel-artifacts DIR`` / ``LLM(..., kernel_artifacts=DIR)``) only LOADS: ``DIR`` is the
root given to prepare (``DIR/<key>`` is looked up) or one artifact directory. A missing artifact, a manifest of
other shapes / sources / versions or an unprepared tensor-parallel size turns the V4 Triton decode attention off
(the torch path) with exactly one printed notice line naming why; a ``DIR`` that is not a directory or holds an
unreadable manifest is a one-line :class:`ConfigError`. Nothing is compiled or tuned on the serving path.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from torchinferno.errors import ConfigError

FORMAT = 1
MANIFEST = "manifest.json"
KERNEL = "sparse_sink_decode"
# the sources whose text is part of the key: the kernel, its dispatch, the decode that builds its inputs
_SOURCES = ("kernels/triton/sparse_sink_decode.py", "kernels/sparse_sink_decode.py", "models/deepseek_v4/decode.py")
CANDIDATES = tuple({"BLOCK_H": bh, "BLOCK_N": bn, "num_warps": w}
                   for bh in (16, 32) for bn in (16, 32, 64) for w in (4, 8))


@dataclass(frozen=True)
class KernelShapes:
    """What the prepared kernels depend on in a V4 config (hashed; ``tp_sizes`` only says which shapes exist)."""

    num_attention_heads: int
    head_dim: int
    sliding_window: int
    index_topk: int
    compress_rate_csa: int
    compress_rate_hca: int
    layer_types: tuple[str, ...]
    dtype: str

    @classmethod
    def of(cls, cfg, dtype: torch.dtype) -> "KernelShapes":
        return cls(cfg.num_attention_heads, cfg.head_dim, cfg.sliding_window, cfg.index_topk, cfg.compress_rate_csa,
                   cfg.compress_rate_hca, tuple(sorted(set(cfg.layer_types))), _dtype_name(dtype))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def versions() -> dict:
    try:
        import triton

        tv = triton.__version__
    except Exception:  # no Triton: the key says so; such an artifact is only ever a torch fallback
        tv = "none"
    return {"torch": torch.__version__, "triton": tv}


def source_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for rel in _SOURCES:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()


def artifact_key(shapes: KernelShapes, vers: dict | None = None, digest: str | None = None) -> str:
    """``v4k-`` + 16 hex digits of sha256(shapes, kernel sources, torch/triton versions)."""
    payload = json.dumps({"format": FORMAT, "shapes": asdict(shapes), "sources": digest or source_digest(),
                          "versions": vers or versions()}, sort_keys=True)
    return "v4k-" + hashlib.sha256(payload.encode()).hexdigest()[:16]


def config_key(local_heads: int, head_dim: int, dtype: str) -> str:
    return f"H{local_heads}-D{head_dim}-{dtype}"


# ------------------------------------------------------------------------------------------------- prepare


def _bench(H: int, D: int, W: int, K: int, dtype: torch.dtype, device, cfg: dict, batch: int = 8,
           iters: int = 20) -> float:
    """Microseconds per launch of the kernel with ``cfg`` on random data (window W rows + K entries)."""
    from torchinferno.kernels.triton import sparse_sink_decode as k

    g = torch.Generator(device="cpu").manual_seed(0)
    bs, blocks = 64, max(4, -(-batch * (W + K) // 64))
    q = torch.randn(batch, H, D, generator=g).to(device=device, dtype=dtype)
    cache = torch.randn(blocks, bs, D, generator=g).to(device=device, dtype=dtype)
    win = torch.randint(0, blocks * bs, (batch, W), generator=g).to(device)
    ent = torch.randint(0, blocks * bs, (batch, K), generator=g).to(device)
    sinks = torch.randn(H, generator=g).to(device)
    k.sparse_sink_decode(q, cache, win, cache, ent, sinks, D**-0.5, cfg)  # compile
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        k.sparse_sink_decode(q, cache, win, cache, ent, sinks, D**-0.5, cfg)
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) * 1000.0 / iters


def prepare(cfg, out: str | Path, dtype: torch.dtype = torch.bfloat16, tp_sizes=(1,), device: str = "auto",
            tune: bool = True, log=print) -> Path:
    """Write (or reuse) ``out/<artifact_key>/manifest.json`` for ``cfg`` -> that directory. See the module doc."""
    from torchinferno.kernels import triton as tri
    from torchinferno.kernels.triton import next_pow2

    shapes = KernelShapes.of(cfg, dtype)
    for tp in tp_sizes:
        if tp < 1 or cfg.num_attention_heads % tp:
            raise ConfigError(f"--tensor-parallel-sizes: {tp} does not divide num_attention_heads={cfg.num_attention_heads}")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    on_gpu = dev.type == "cuda" and tri.available()
    vers, digest = versions(), source_digest()
    key = artifact_key(shapes, vers, digest)
    target = Path(out).expanduser() / key
    target.mkdir(parents=True, exist_ok=True)
    K = min(cfg.index_topk, 4096)  # CSA's selected entries (HCA layers read fewer at these lengths)
    configs = {}
    for tp in sorted(set(tp_sizes)):
        H = cfg.num_attention_heads // tp
        ck = config_key(H, cfg.head_dim, shapes.dtype)
        if ck in configs:
            continue
        from torchinferno.kernels.triton.sparse_sink_decode import DEFAULT_CONFIG

        entry = {"config": dict(DEFAULT_CONFIG), "tuned": False, "tp_size": tp}
        if on_gpu and tune:
            timings = []
            for cand in CANDIDATES:
                if cand["BLOCK_H"] > max(16, next_pow2(H)):
                    continue
                try:
                    us = _bench(H, cfg.head_dim, cfg.sliding_window, K, dtype, dev, cand)
                except Exception as e:  # a tile that does not fit (registers / shared memory): skipped, recorded
                    timings.append({**cand, "error": type(e).__name__})
                    continue
                timings.append({**cand, "us": round(us, 3)})
            ok = [t for t in timings if "us" in t]
            if ok:
                best = min(ok, key=lambda t: t["us"])
                entry = {"config": {k: best[k] for k in ("BLOCK_H", "BLOCK_N", "num_warps")}, "tuned": True,
                         "tp_size": tp, "us": best["us"], "candidates": timings}
        configs[ck] = entry
        log(f"  {KERNEL} {ck}: {entry['config']}" + (f" {entry['us']:.1f} us" if entry.get("tuned") else " (defaults)"))
    manifest = {
        "format": FORMAT, "key": key, "kernel": KERNEL, "shapes": asdict(shapes), "sources": digest, **vers,
        "tp_sizes": sorted(set(tp_sizes)), "device": torch.cuda.get_device_name(dev) if on_gpu else str(dev),
        "tuned": on_gpu and tune, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "configs": configs,
    }
    tmp = target / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    tmp.replace(target / MANIFEST)
    return target


# ------------------------------------------------------------------------------------------------- load


def _read_manifest(path: Path) -> dict:
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--kernel-artifacts: {path} is not a readable manifest ({type(e).__name__})") from None
    if not isinstance(m, dict) or "key" not in m or not isinstance(m.get("configs"), dict):
        raise ConfigError(f"--kernel-artifacts: {path} is not a prepare-deepseek-v4-kernels manifest")
    return m


def load(directory: str | Path, cfg, dtype: torch.dtype, local_heads: int) -> tuple[dict | None, str]:
    """-> (the kernel config for this model, "") or (None, why not). Raises ConfigError for a bad directory."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--kernel-artifacts: {root} is not a directory")
    shapes = KernelShapes.of(cfg, dtype)
    vers, digest = versions(), source_digest()
    key = artifact_key(shapes, vers, digest)
    if (root / MANIFEST).is_file():
        man = _read_manifest(root / MANIFEST)
    elif (root / key / MANIFEST).is_file():
        man = _read_manifest(root / key / MANIFEST)
    else:
        return None, f"no artifact {key} for this config in {root} (run prepare-deepseek-v4-kernels)"
    if man["key"] != key:
        why = [f"{k} {man.get(k)} != {v}" for k, v in vers.items() if man.get(k) != v]
        if man.get("sources") != digest:
            why.append("kernel sources changed")
        if man.get("shapes") != json.loads(json.dumps(asdict(shapes))):
            why.append("prepared for other config shapes")
        return None, f"artifact {man['key']} does not match this model ({'; '.join(why) or 'key differs'})"
    ck = config_key(local_heads, cfg.head_dim, shapes.dtype)
    entry = man["configs"].get(ck)
    if entry is None:
        return None, f"artifact {key} has no {ck} (prepared tensor-parallel sizes: {man.get('tp_sizes')})"
    return dict(entry["config"]), ""


def apply(model, directory: str | Path, log=None) -> bool:
    """Load the artifact for ``model`` (a deepseek-v4 model) and give its attention layers the tile config; else turn
    their Triton sparse attention off (decode, and the prefill through the same kernel) with one notice line.
    -> whether the artifact was loaded."""
    from torchinferno.models.deepseek_v4.model import V4Attention

    layers = [m for m in model.modules() if isinstance(m, V4Attention)]
    if not layers:
        raise ConfigError("--kernel-artifacts applies to deepseek-v4 models only")
    dtype = model.model.embed_tokens.weight.dtype  # the activation dtype (linears may be quantized)
    config, why = load(directory, model.config, dtype, layers[0].num_heads)
    for m in layers:
        m.kernel_config = config
        m.sparse_kernel = m.sparse_kernel and config is not None
    if config is None:
        (log or (lambda s: print(s, file=sys.stderr, flush=True)))(
            f"notice: deepseek-v4 kernel artifacts not used, sparse attention (decode and prefill) falls back to torch: "
            f"{why}")
        return False
    return True
