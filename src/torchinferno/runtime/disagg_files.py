"""``disagg-init``: write one standalone, editable Python file per rank, plus ``manifest.json`` and ``README.md``.

Rank ``r`` of ``P`` prefill and ``D`` decode ranks is ``rank_<r>_prefill.py`` for ``r < P`` and ``rank_<r>_decode.py``
otherwise; it serves on ``base_port + r``. A file holds its whole configuration as literals (``CONFIG``) and a
``Rank`` subclass of ``DisaggRank`` where an agent overrides ``prefill``/``decode``/``release`` while keeping their
RPC contracts (documented in the file's header). Model: a checkpoint (``model``) or, by default, the default model
when it is already converted in the local cache, else a tiny random model of ``family`` with a fixed seed, so that
prefill and decode ranks build identical weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torchinferno.errors import ConfigError

__all__ = ["RankFilesSpec", "default_model_source", "rank_file_name", "write_rank_files"]


@dataclass(frozen=True)
class RankFilesSpec:
    """``disagg-init``'s choices. ``model`` None and ``family`` None: the default model if converted locally, else
    a tiny random llama3 (``default_model_source``)."""

    prefill_ranks: int = 1
    decode_ranks: int = 1
    base_port: int = 8800
    device: str = "cpu"
    host: str = "127.0.0.1"
    model: str | None = None
    family: str | None = None
    size: str = "debug"
    seed: int = 0
    dtype: str | None = None  # None: float32 on CPU; bfloat16 for a checkpoint on CUDA
    block_size: int = 16
    num_blocks: int = 256
    kv_ttl_s: float = 60.0
    kv_cache_dtype: str = "auto"

    def validate(self) -> RankFilesSpec:
        if self.prefill_ranks < 1 or self.decode_ranks < 1:
            raise ConfigError(f"--prefill-ranks and --decode-ranks must be >= 1, got {self.prefill_ranks}, "
                              f"{self.decode_ranks}")
        last = self.base_port + self.prefill_ranks + self.decode_ranks - 1
        if self.base_port < 1 or last > 65535:
            raise ConfigError(f"--base-port {self.base_port}: ports {self.base_port}..{last} must lie in 1..65535")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"unknown --device '{self.device}' (valid: cpu, cuda, cuda:N)")
        if self.model is not None and self.family is not None:
            raise ConfigError("give --model or --family, not both")
        if self.family is not None:
            from torchinferno.engine.assembly import tiny_kind_family

            tiny_kind_family(self.family)  # ConfigError listing the valid names
        if self.block_size < 1 or self.num_blocks < 1:
            raise ConfigError("--block-size and --num-blocks must be >= 1")
        if self.kv_cache_dtype != "auto":
            from torchinferno.kernels.kv_dtype import parse_kv_cache_dtype

            parse_kv_cache_dtype(self.kv_cache_dtype)  # ConfigError listing the valid spellings
        return self


def rank_file_name(rank: int, prefill_ranks: int) -> str:
    return f"rank_{rank}_{'prefill' if rank < prefill_ranks else 'decode'}.py"


def default_model_source(cache_dir: str | None = None) -> tuple[str | None, str]:
    """``(model path or None, why)``: the default model's converted directory when it exists locally (no download),
    else None (the caller falls back to a tiny random model)."""
    from torchinferno.checkpoint.zoo import _cache_root
    from torchinferno.engine.assembly import DEFAULT_MODEL

    d = _cache_root(cache_dir) / "models" / DEFAULT_MODEL
    if (d / "config.json").is_file():
        return str(d), f"the default model {DEFAULT_MODEL}, converted locally"
    return None, f"the default model {DEFAULT_MODEL} is not converted locally (torchinferno pull {DEFAULT_MODEL})"


_HEADER = '''#!/usr/bin/env python3
"""TorchInferno disaggregated rank {rank}: {ROLE} (written by `torchinferno disagg-init`; edit freely).

Model: {model_line}
Serves http://{host}:{port} (port = base port {base_port} + rank {rank}); {n_p} prefill rank(s), {n_d} decode rank(s).

RPC (JSON control messages; tensors as safetensors bytes inside a framed body, never pickle; the frame is
b"TIDG" + u32 LE JSON length + JSON + safetensors, torchinferno/runtime/disagg_wire.py):
  GET  /health    -> {{"status": "ok", "role", "family", "free_blocks", "held_requests", "kv_bytes_per_token", ...}}
  POST /prefill   JSON {{"request_id", "prompt_token_ids": [int, ...], "sampling": {{"max_tokens", "temperature",
                  "top_k", "top_p", "min_p", "seed", "stop_token_ids", "ignore_eos"}}}}
                  -> frame: {{"request_id", "model_id", "first_token", "finish_reason", "num_prompt_tokens",
                  "cached_tokens" (prefix-cache hit), "kv_bytes", "prefill_s", "pack_s"}}
                  + tensors "layer.<i>.<name>" [num_prompt_tokens, *per_token_shape]: the prompt's KV for every
                  layer and every KV kind of the family's KVSpec, in the cache's dtype (+ "sampler.rng_state" for
                  a seeded sampled request). A prefill rank holds the prompt's KV blocks until /release or
                  kv_ttl_s seconds.
  POST /kv        JSON {{"request_id"}} -> the held request's frame again (retry on another decode rank)
  POST /decode    frame: {{"request_id", "model_id", "prompt_token_ids", "first_token", "sampling"}} + the
                  prefill's tensors (model_id, optional, must match this rank's model)
                  -> {{"token_ids": [first_token, ...], "finish_reason", "kv_bytes_received", "unpack_s", "decode_s"}}
  POST /release   JSON {{"request_id"}} -> {{"released": true, "freed_blocks": n}}
Refusals are 4xx JSON {{"error": "<one line>"}} (503 when no KV blocks are free) and change nothing.

Run:  PYTHONPATH=<repo>/src python3 {file_name} [--port N] [--kv-ttl-s S] [--num-blocks N] [--threads N]
Drive: python -m torchinferno.cli disagg-smoke --prefill-url http://HOST:PREFILL_PORT --decode-url http://HOST:DECODE_PORT
"""

import sys

try:
    from torchinferno.runtime.disagg import DisaggRank, RankConfig, serve_rank
except ImportError as e:
    sys.exit(f"{file_name}: cannot import torchinferno ({{e}}): run with PYTHONPATH=<repo>/src or install the package")

CONFIG = RankConfig(
    role={role!r},
    rank={rank},
    host={host!r},
    port={port},
    device={device!r},
    model={model!r},
    model_kind={model_kind!r},
    size={size!r},
    seed={seed},
    dtype={dtype!r},
    kv_cache_dtype={kv_cache_dtype!r},
    block_size={block_size},
    num_blocks={num_blocks},
    kv_ttl_s={kv_ttl_s!r},
)


class Rank(DisaggRank):
    """This rank's behaviour: override prefill(control) / decode(control, tensors) / release(control) here,
    keeping the request/reply contracts above (torchinferno/runtime/disagg_rank.py has the defaults)."""


if __name__ == "__main__":
    sys.exit(serve_rank(Rank, CONFIG, sys.argv[1:], prog={file_name!r}))
'''


def write_rank_files(out_dir: str | Path, spec: RankFilesSpec) -> list[Path]:
    """Write the rank files, ``manifest.json`` and ``README.md`` into ``out_dir`` (created); returns the rank files."""
    spec = spec.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, model_kind, why = spec.model, None, "given with --model"
    if model is None and spec.family is None:
        model, why = default_model_source()
    if model is None:
        from torchinferno.engine.assembly import tiny_kind_family

        model_kind = tiny_kind_family(spec.family or "llama3")
        why = (f"a tiny random {model_kind} model (size {spec.size}, seed {spec.seed}): every rank builds identical "
               f"weights from the seed" + ("" if spec.family else f"; {why}"))
    else:
        why = f"{model} ({why})"
    dtype = spec.dtype or ("bfloat16" if model is not None and spec.device.startswith("cuda") else "float32")
    n = spec.prefill_ranks + spec.decode_ranks
    files, ranks = [], []
    for r in range(n):
        role = "prefill" if r < spec.prefill_ranks else "decode"
        name = rank_file_name(r, spec.prefill_ranks)
        text = _HEADER.format(
            rank=r, ROLE=role.upper(), role=role, model_line=why, host=spec.host, port=spec.base_port + r,
            base_port=spec.base_port, n_p=spec.prefill_ranks, n_d=spec.decode_ranks, file_name=name,
            device=spec.device, model=model, model_kind=model_kind, size=spec.size, seed=spec.seed, dtype=dtype,
            block_size=spec.block_size, num_blocks=spec.num_blocks, kv_ttl_s=float(spec.kv_ttl_s),
            kv_cache_dtype=spec.kv_cache_dtype)
        path = out / name
        path.write_text(text)
        path.chmod(0o755)
        files.append(path)
        ranks.append({"rank": r, "role": role, "file": name, "url": f"http://{spec.host}:{spec.base_port + r}"})
    manifest = {"prefill_ranks": spec.prefill_ranks, "decode_ranks": spec.decode_ranks, "base_port": spec.base_port,
                "device": spec.device, "model": model, "model_kind": model_kind, "size": spec.size, "seed": spec.seed,
                "dtype": dtype, "kv_cache_dtype": spec.kv_cache_dtype, "block_size": spec.block_size, "num_blocks": spec.num_blocks, "ranks": ranks}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    p0, d0 = ranks[0], ranks[spec.prefill_ranks]
    (out / "README.md").write_text(
        f"# Disaggregated rank files\n\nModel: {why}.\nDevice: {spec.device}. One file per rank; port = "
        f"{spec.base_port} + rank. Each file documents its RPC at the top; edit them freely.\n\n"
        f"Start ranks in separate shells (with the package importable, e.g. PYTHONPATH=src):\n\n"
        f"    python3 {out / p0['file']}\n    python3 {out / d0['file']}\n\n"
        f"Send a request through them:\n\n    PYTHONPATH=src python3 -m torchinferno.cli disagg-smoke "
        f"--prefill-url {p0['url']} --decode-url {d0['url']} --prompt 1 2 3 --new-tokens 2 --check\n\n"
        + "| rank | role | file | url |\n|---|---|---|---|\n"
        + "".join(f"| {x['rank']} | {x['role']} | {x['file']} | {x['url']} |\n" for x in ranks))
    return files
