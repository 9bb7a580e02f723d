"""Shared by the kernel tests: running a checks script on Triton's CPU interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

LANES = 2
"""Interpreter processes run at once. Each is one single-threaded Python process while pytest itself only waits, so
on the 2-core CI machine two of them use both cores; every test still waits for and asserts its own check."""


def _run(script: str, check: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, str(HERE / script), check], check=False, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def _interpreter_runs(request):
    """(script, check) -> the future of its run; one pool per test module, shut down (after its runs) with it."""
    pool = ThreadPoolExecutor(max_workers=LANES)
    runs: dict[tuple[str, str], Future] = {}
    yield pool, runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def interpreter_check(request, _interpreter_runs):
    """``run(script, check)``: ``tests/kernels/<script>`` in its own process with ``TRITON_INTERPRET=1`` (the
    interpreter must be on before Triton sees a kernel); asserts it exits 0 and prints ``ok <check>``.

    The first call in a module also starts (``LANES`` at a time, in collection order) the same script's runs for the
    ``check`` parameters of the module's other selected tests that use this fixture, so they overlap."""
    pytest.importorskip("triton")
    pool, runs = _interpreter_runs

    def run(script: str, check: str) -> None:
        if (script, check) not in runs:
            wanted = [check]
            for item in request.session.items:  # the selected tests of this module, in order
                cs = getattr(item, "callspec", None)
                if (item.module is request.module and "interpreter_check" in getattr(item, "fixturenames", ())
                        and cs is not None and "check" in cs.params):
                    wanted.append(cs.params["check"])
            for c in wanted:
                if (script, c) not in runs:
                    runs[(script, c)] = pool.submit(_run, script, c)
        proc = runs[(script, check)].result()
        assert proc.returncode == 0 and f"ok {check}" in proc.stdout, proc.stderr[-3000:]

    return run
