"""Start an OpenAI-compatible server as a subprocess on a free loopback port, wait, stop.

Used by the suites (``torchinferno serve`` / ``vllm serve``) and ``openai-server-microbench``.
Only the process this object started is ever signalled (by its pid).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchinferno.errors import ConfigError
from torchinferno.ports import free_port

__all__ = ["free_port", "LocalServer", "torchinferno_serve_argv", "wait_for_health"]


def torchinferno_serve_argv(model: str | None, model_kind: str | None, port: int, device: str = "cpu",
                            dtype: str = "bfloat16", extra: list[str] | None = None) -> list[str]:
    """``torchinferno serve ...`` as it would be typed (``argv[0]`` is the console script)."""
    argv = ["torchinferno", "serve"]
    if model_kind and not model:
        argv += ["--model-kind", model_kind]
    else:
        argv += [model or "smollm2-135m-instruct"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--device", device, "--dtype", dtype]
    return argv + list(extra or [])


def wait_for_health(base_url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ConfigError(f"server exited with code {proc.returncode} before becoming healthy")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise ConfigError(f"server at {base_url} did not become healthy within {timeout_s:.0f} s")


class LocalServer:
    """``with LocalServer(argv, port) as s: ... s.base_url``; logs go to ``log_path``.

    ``argv[0] == "torchinferno"`` runs as ``python -m torchinferno.cli`` with this interpreter so the
    server uses the same environment even when the console script is not on PATH.
    """

    def __init__(self, argv: list[str], port: int, log_path: str | Path | None = None, startup_timeout_s: float = 300.0):
        self.argv, self.port, self.startup_timeout_s = list(argv), port, startup_timeout_s
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="server-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    def _exec_argv(self) -> list[str]:
        if self.argv and self.argv[0] == "torchinferno":
            return [sys.executable, "-m", "torchinferno.cli", *self.argv[1:]]
        return self.argv

    def start(self) -> "LocalServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        try:
            from torchinferno.env import child_env_outside_torchrun

            # a server started by a torchrun rank starts its own workers: it must not join torchrun's world
            self.proc = subprocess.Popen(self._exec_argv(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=child_env_outside_torchrun())
        except FileNotFoundError:
            log.close()
            raise ConfigError(f"cannot start server: {self.argv[0]!r} not found") from None
        log.close()
        try:
            wait_for_health(self.base_url, self.startup_timeout_s, self.proc)
        except ConfigError as e:
            tail = self.log_tail()
            self.stop()
            raise ConfigError(f"{e}{'; last log line: ' + tail if tail else ''} (log: {self.log_path})") from None
        return self

    def log_tail(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def stop(self, timeout_s: float = 20.0) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGINT)  # our own session: the server and anything it spawned
        except ProcessLookupError:
            return
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
