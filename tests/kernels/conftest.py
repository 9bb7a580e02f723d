"""Shared by the kernel tests: running a checks script on Triton's CPU interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def interpreter_check():
    """``run(script, check)``: ``tests/kernels/<script>`` in its own process with ``TRITON_INTERPRET=1`` (the
    interpreter must be on before Triton sees a kernel); asserts it exits 0 and prints ``ok <check>``."""
    pytest.importorskip("triton")

    def run(script: str, check: str) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        proc = subprocess.run([sys.executable, str(HERE / script), check], check=False, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and f"ok {check}" in proc.stdout, proc.stderr[-3000:]

    return run
