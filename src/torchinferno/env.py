"""The only module that reads environment variables.

Environment variables are for platform and debug facts only; features are flags and configs.
Every entry is declared here, typed, with its meaning.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, TextIO


@dataclass(frozen=True)
class Env:
    hf_token: str | None
    """HF_TOKEN: credentials for Hub downloads (never read anywhere else)."""
    cache_dir: Path
    """TORCHINFERNO_CACHE_DIR: default model cache (``~/.cache/torchinferno``); ``--cache-dir`` overrides."""
    hf_offline: bool
    """HF_HUB_OFFLINE=1: never try the Hub."""
    debug: bool
    """TORCHINFERNO_DEBUG=1: show full tracebacks instead of one-line errors."""
    torchrun_rank: int | None = None
    """RANK (set by torchrun): this process's rank in a world it launched; None when not under torchrun."""
    torchrun_world_size: int | None = None
    """WORLD_SIZE (set by torchrun): how many ranks torchrun launched."""
    torchrun_local_rank: int | None = None
    """LOCAL_RANK (set by torchrun): the rank on this host (the CUDA device index)."""


# The TORCHINFERNO_* variables ``read_env`` reads; any other set TORCHINFERNO_* variable gets one warning line.
READ_VARS = ("TORCHINFERNO_CACHE_DIR", "TORCHINFERNO_DEBUG")


def read_env() -> Env:
    e = os.environ
    cache = e.get("TORCHINFERNO_CACHE_DIR") or str(Path.home() / ".cache" / "torchinferno")
    return Env(
        hf_token=e.get("HF_TOKEN") or None,
        cache_dir=Path(cache).expanduser(),
        hf_offline=e.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"),
        debug=e.get("TORCHINFERNO_DEBUG", "0") not in ("", "0", "false", "False"),
        torchrun_rank=_int_or_none(e.get("RANK")),
        torchrun_world_size=_int_or_none(e.get("WORLD_SIZE")),
        torchrun_local_rank=_int_or_none(e.get("LOCAL_RANK")),
    )


# What torchrun sets in each process it launches: a child process that must not join that world (a server
# started by rank 0 of a benchmark run) is started without them.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def child_env_outside_torchrun() -> dict[str, str]:
    """This process's environment without torchrun's variables (for a child that runs its own world)."""
    return {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value in (None, "") else int(value)
    except ValueError:
        return None


def apply_platform_defaults() -> None:
    """Process-level platform defaults, applied by the CLI entry point before torch is imported.

    THP_MEM_ALLOC_ENABLE=1 lets PyTorch's CPU allocator back large tensors with transparent huge
    pages: decode streams every weight once per step, and 2 MiB pages cut the TLB misses of that
    stream (about 25% faster batch-1 decode measured on a 2-core CPU). A value already set by the
    user wins (THP_MEM_ALLOC_ENABLE=0 opts out).
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


# ------------------------------------------------------------------------------------ unread knobs
# The original TorchInferno was tuned through ~100 TORCHINFERNO_* variables; we use flags. A user
# who sets one of them gets one line naming the flag that does the job, or saying there is none.
# ``NAME`` matches exactly, ``PREFIX*`` any name that starts with PREFIX; the longest pattern wins.
_NO_TP = "no equivalent: pass --tensor-parallel-size N (serve starts its N worker ranks itself on loopback)"
_KERNELS = ("no equivalent: kernels are chosen by device (Triton on CUDA, torch elsewhere), never by environment; "
            "compare them with perf-smoke or profile-pattern")
_RAGGED = "no equivalent: every step runs one flattened ragged batch (no padding or length groups to tune)"
_ADMISSION = ("no equivalent: the scheduler admits waiting requests at every step; batches are bounded by "
              "--max-num-seqs and --max-num-batched-tokens")
_WARMUP = ("no equivalent: on CUDA the server warms up once at startup with throwaway requests sized from the "
           "engine config; on CPU there is nothing to warm up")
UNREAD_VARS: tuple[tuple[str, str], ...] = (
    ("TORCHINFERNO_OPENAI_AUTO_TORCHRUN", _NO_TP),
    ("TORCHINFERNO_TORCHRUN_RDZV_ENDPOINT", _NO_TP),
    ("TORCHINFERNO_OPENAI_PREFIX_CACHE", "use --no-prefix-caching (serve) to turn prefix caching off"),
    ("TORCHINFERNO_OPENAI_PREFIX_CACHE_*", "no equivalent: the prefix cache is the paged KV block pool itself "
                                           "(size it with --kv-cache-memory, LRU eviction); --no-prefix-caching turns it off"),
    ("TORCHINFERNO_OPENAI_PREFIX_CACHE_SHARED_SAMPLE", "no flag needed: prefix caching serves sampled requests too "
                                                       "(--no-prefix-caching turns it off)"),
    ("TORCHINFERNO_OPENAI_PROMPT_TOKEN_CACHE_MAX_ENTRIES", "no equivalent: each request's prompt is tokenized once; there is no tokenization cache"),
    ("TORCHINFERNO_OPENAI_STARTUP_WARMUP", _WARMUP),
    ("TORCHINFERNO_OPENAI_TOKENIZER_WARMUP", _WARMUP),
    ("TORCHINFERNO_OPENAI_WARMUP_*", _WARMUP),
    ("TORCHINFERNO_OPENAI_STREAM_MICROBATCH_SIZE", _ADMISSION),
    ("TORCHINFERNO_OPENAI_SINGLE_ADMISSION_WAIT_MS", "--single-request-admission-wait-ms is its spelling, accepted "
                                                     "but without effect: the scheduler admits waiting requests at every step"),
    ("TORCHINFERNO_OPENAI_TEMPERATURE_ADMISSION_WAIT_MS", _ADMISSION),
    ("TORCHINFERNO_OPENAI_SHARED_PREFIX_*", _RAGGED),
    ("TORCHINFERNO_OPENAI_RAGGED_DECODE_*", _RAGGED),
    ("TORCHINFERNO_CONTINUOUS_RAGGED_DECODE_*", _RAGGED),
    ("TORCHINFERNO_OPENAI_PHASE_TIMINGS", "use openai-microbench --phase-timings (per-request latencies are on GET /metrics)"),
    ("TORCHINFERNO_OPENAI_QUEUE_PROFILE_JSONL", "use serve --disaggregation-mode prefill-decode --disaggregation-record "
                                                "FILE (the disaggregated_runtime_integrity JSONL records)"),
    ("TORCHINFERNO_OPENAI_DISAGG_*", "use serve --disaggregation-mode prefill-decode with --prefill-devices / "
                                     "--decode-devices, --disaggregation-profile, --disaggregation-record; the batch "
                                     "limit of each role is --max-num-seqs"),
    ("TORCHINFERNO_CUDAGRAPH_*", "use --enforce-eager to turn CUDA graphs off; decode graphs are captured per "
                                 "batch-size bucket up to --max-num-seqs, with no per-piece switches"),
    ("TORCHINFERNO_FI_DECODE_GRAPH", "no equivalent: there is no FlashInfer backend; --enforce-eager turns CUDA graphs off"),
    ("TORCHINFERNO_TRITON_*", _KERNELS),
    ("TORCHINFERNO_DECODE_LINEAR_MV", _KERNELS),
    ("TORCHINFERNO_DECODE_TRANSPOSED_WEIGHTS", _KERNELS),
    ("TORCHINFERNO_COMPILE_ROTARY", _KERNELS),
    ("TORCHINFERNO_PROFILE_FAST_PREFILL", "no equivalent: profile a prefill with profile-run or profile-region"),
    ("TORCHINFERNO_SYMM_MEM_*", _NO_TP),
    ("TORCHINFERNO_GREEDY_SAMPLE_GATHER", "no equivalent: sampling runs on one device (no tensor-parallel sampler yet)"),
    ("TORCHINFERNO_TEMPERATURE_SAMPLE_GATHER*", "no equivalent: sampling runs on one device (no tensor-parallel sampler yet)"),
    ("TORCHINFERNO_OPTIONAL_WARNINGS", "no equivalent: nothing falls back silently; a missing fast path is an error "
                                       "or is chosen by device, not by an optional probe"),
    ("TORCHINFERNO_V4_KERNEL_ARTIFACT_DIR", "use --kernel-artifacts DIR (serve) or LLM(kernel_artifacts=DIR): the "
                                            "directory prepare-deepseek-v4-kernels wrote (Triton tiles; there is no "
                                            "TileLang/Marlin provider)"),
)


def _advice(name: str) -> str:
    best, advice = -1, ""
    for pattern, text in UNREAD_VARS:
        hit = name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern
        if hit and len(pattern) > best:
            best, advice = len(pattern), text
    if best < 0:
        return (f"TorchInferno reads only {', '.join(READ_VARS)} (and HF_TOKEN, HF_HUB_OFFLINE); "
                "features are command-line flags (see --help)")
    return advice


def unread_env_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per set ``TORCHINFERNO_*`` variable that nothing reads, sorted by name (pure)."""
    e = os.environ if environ is None else environ
    names = sorted(n for n in e if n.startswith("TORCHINFERNO_") and n not in READ_VARS)
    return [f"warning: {n} is set but TorchInferno does not read it; {_advice(n)}" for n in names]


_warned = False


def warn_unread_env(stream: TextIO | None = None) -> list[str]:
    """Print ``unread_env_warnings()`` once per process (later calls print nothing); returns what it printed.

    Called by the CLI entry point at startup, never at import."""
    global _warned
    if _warned:
        return []
    _warned = True
    lines = unread_env_warnings()
    out = stream if stream is not None else sys.stderr
    for line in lines:
        print(line, file=out)
    return lines
