"""Unread TORCHINFERNO_* knobs of the original get one warning line each, naming the flag that does the
job or saying there is none; variables we read get none; the lines come at CLI startup, once, never at import."""

import io
import os
import subprocess
import sys

import pytest

from torchinferno import env

# The knobs the original README documents (its "OpenAI serving also has explicit environment knobs" section
# and the rest of the file): each must get specific advice, not the generic line.
README_KNOBS = """
TORCHINFERNO_OPENAI_AUTO_TORCHRUN TORCHINFERNO_TORCHRUN_RDZV_ENDPOINT TORCHINFERNO_OPENAI_PREFIX_CACHE
TORCHINFERNO_OPENAI_PREFIX_CACHE_MIN_TOKENS TORCHINFERNO_OPENAI_PREFIX_CACHE_MAX_TOKENS
TORCHINFERNO_OPENAI_PREFIX_CACHE_MAX_ENTRIES TORCHINFERNO_OPENAI_PREFIX_CACHE_MATERIALIZE_GENERATED
TORCHINFERNO_OPENAI_PROMPT_TOKEN_CACHE_MAX_ENTRIES TORCHINFERNO_OPENAI_STARTUP_WARMUP TORCHINFERNO_OPENAI_TOKENIZER_WARMUP
TORCHINFERNO_OPENAI_WARMUP_PROMPT_TOKENS TORCHINFERNO_OPENAI_WARMUP_NEW_TOKENS TORCHINFERNO_OPENAI_WARMUP_CACHE_TOKENS
TORCHINFERNO_OPENAI_WARMUP_PROMPT_TOKEN_BUCKETS TORCHINFERNO_OPENAI_WARMUP_RAGGED_DECODE_BATCH_SIZES
TORCHINFERNO_OPENAI_STREAM_MICROBATCH_SIZE TORCHINFERNO_OPENAI_SINGLE_ADMISSION_WAIT_MS
TORCHINFERNO_OPENAI_TEMPERATURE_ADMISSION_WAIT_MS TORCHINFERNO_OPENAI_SHARED_PREFIX_DENSE_GROUP_DECODE
TORCHINFERNO_OPENAI_SHARED_PREFIX_DENSE_GROUP_DECODE_MAX_GROUPS TORCHINFERNO_OPENAI_SHARED_PREFIX_PADDED_SUFFIX_PREFILL
TORCHINFERNO_OPENAI_RAGGED_DECODE_FULL_BATCH_MIN_ROWS TORCHINFERNO_OPENAI_RAGGED_DECODE_POWER2_BUCKETS
TORCHINFERNO_CONTINUOUS_RAGGED_DECODE_MANY_ASYNC_READBACK TORCHINFERNO_OPENAI_PHASE_TIMINGS
TORCHINFERNO_OPENAI_PREFIX_CACHE_SHARED_SAMPLE TORCHINFERNO_CUDAGRAPH_PREFILL TORCHINFERNO_CUDAGRAPH_DECODE_STEP
TORCHINFERNO_CUDAGRAPH_DECODE_STEP_MAX_BATCH TORCHINFERNO_CUDAGRAPH_ALLREDUCE TORCHINFERNO_CUDAGRAPH_DECODE_DEBUG
TORCHINFERNO_TRITON_DECODE_ATTENTION TORCHINFERNO_TRITON_RMS_NORM TORCHINFERNO_TRITON_SWIGLU
TORCHINFERNO_TRITON_STREAMING_DECODE_ATTENTION_BLOCK_S TORCHINFERNO_DECODE_LINEAR_MV TORCHINFERNO_DECODE_TRANSPOSED_WEIGHTS
TORCHINFERNO_SYMM_MEM_ALLREDUCE TORCHINFERNO_SYMM_MEM_PREFILL_ALLREDUCE TORCHINFERNO_COMPILE_ROTARY
TORCHINFERNO_GREEDY_SAMPLE_GATHER TORCHINFERNO_TEMPERATURE_SAMPLE_GATHER TORCHINFERNO_TEMPERATURE_SAMPLE_GATHER_STRICT
TORCHINFERNO_PROFILE_FAST_PREFILL TORCHINFERNO_OPTIONAL_WARNINGS TORCHINFERNO_V4_KERNEL_ARTIFACT_DIR
TORCHINFERNO_OPENAI_QUEUE_PROFILE_JSONL TORCHINFERNO_OPENAI_DISAGG_MAX_BATCH_SIZE TORCHINFERNO_FI_DECODE_GRAPH
""".split()

GENERIC = "TorchInferno reads only"


def _line(name: str) -> str:
    lines = env.unread_env_warnings({name: "1"})
    assert len(lines) == 1 and lines[0].startswith(f"warning: {name} is set"), lines
    return lines[0]


@pytest.mark.parametrize("name,needle", [
    ("TORCHINFERNO_OPENAI_PREFIX_CACHE", "--no-prefix-caching"),
    ("TORCHINFERNO_OPENAI_PREFIX_CACHE_MAX_ENTRIES", "--kv-cache-memory"),
    ("TORCHINFERNO_CUDAGRAPH_DECODE_STEP", "--enforce-eager"),
    ("TORCHINFERNO_OPENAI_SINGLE_ADMISSION_WAIT_MS", "--single-request-admission-wait-ms"),
    ("TORCHINFERNO_OPENAI_PHASE_TIMINGS", "--phase-timings"),
    ("TORCHINFERNO_OPENAI_AUTO_TORCHRUN", "--tensor-parallel-size"),
    ("TORCHINFERNO_TRITON_RMS_NORM", "no equivalent"),
    ("TORCHINFERNO_V4_KERNEL_ARTIFACT_DIR", "--kernel-artifacts"),
    ("TORCHINFERNO_FROBNICATE", GENERIC),
])
def test_each_knob_names_its_flag_or_says_none(name, needle):
    assert needle in _line(name)


def test_every_readme_knob_has_specific_advice():
    generic = [n for n in README_KNOBS if GENERIC in _line(n)]
    assert not generic


def test_read_and_foreign_variables_are_silent():
    assert env.unread_env_warnings({"TORCHINFERNO_CACHE_DIR": "/tmp/x", "TORCHINFERNO_DEBUG": "1", "HF_TOKEN": "t",
                                    "PATH": "/bin"}) == []
    two = env.unread_env_warnings({"TORCHINFERNO_TRITON_SWIGLU": "1", "TORCHINFERNO_DEBUG": "1", "TORCHINFERNO_ZZZ": "0"})
    assert [ln.split()[1] for ln in two] == ["TORCHINFERNO_TRITON_SWIGLU", "TORCHINFERNO_ZZZ"]


def test_warned_once_per_process(monkeypatch):
    monkeypatch.setattr(env, "_warned", False)
    monkeypatch.setenv("TORCHINFERNO_OPENAI_PREFIX_CACHE", "0")
    first, second = io.StringIO(), io.StringIO()
    assert len(env.warn_unread_env(first)) == 1
    assert env.warn_unread_env(second) == [] and second.getvalue() == ""
    assert first.getvalue().count("\n") == 1 and "--no-prefix-caching" in first.getvalue()


def test_cli_startup_warns_once_on_stderr(monkeypatch, capsys):
    from torchinferno.cli.main import main

    monkeypatch.setattr(env, "_warned", False)
    monkeypatch.setenv("TORCHINFERNO_CUDAGRAPH_DECODE_STEP", "0")
    assert main(["audit", "--json"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TORCHINFERNO_CUDAGRAPH_DECODE_STEP" in err[0] and "--enforce-eager" in err[0]


def test_import_prints_nothing():
    e = {**os.environ, "TORCHINFERNO_OPENAI_PREFIX_CACHE": "0", "TORCHINFERNO_ZZZ": "1"}
    p = subprocess.run([sys.executable, "-c", "import torchinferno, torchinferno.env, torchinferno.cli.main, "
                        "torchinferno.openai_server"], capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode == 0 and p.stderr == "" and p.stdout == ""


def test_child_env_outside_torchrun_drops_the_launchers_variables(monkeypatch):
    from torchinferno.env import child_env_outside_torchrun, read_env

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29500")
    e = read_env()
    assert (e.torchrun_rank, e.torchrun_world_size, e.torchrun_local_rank) == (1, 2, None)
    child = child_env_outside_torchrun()
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT"} & set(child) and child.get("PATH") is not None
