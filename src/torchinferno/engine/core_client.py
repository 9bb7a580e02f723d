"""The API side's handle on the engine-core process: start it, talk to it, watch it, stop it.

``EngineCoreProcess`` picks two IPC endpoints in a private temporary directory, spawns
``engine.core_proc.run_engine_core`` (which binds them) and blocks until the core reports ``CoreInfo``
(or the one-line error that stopped it: raised here as ``ConfigError`` so the CLI prints it), then
connects. The sending side connects, so its queue exists at once and a send never fails for want of a
peer; sending never blocks (unbounded high-water mark). Receiving is the caller's business
(``AsyncLLM`` wraps the receive socket for asyncio).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time

import zmq

from torchinferno.engine.core_proc import CoreAddresses, CoreProcessConfig, run_engine_core
from torchinferno.engine.core_types import CoreInfo, Shutdown, encoder, from_core_decoder
from torchinferno.errors import ConfigError

__all__ = ["EngineCoreProcess", "EngineCoreStartError"]


class EngineCoreStartError(ConfigError):
    """The engine-core process stopped before it was ready."""


class EngineCoreProcess:
    """One engine-core process and the two sockets to it (module docstring).

    Invariants: ``info`` is set once the constructor returns; ``send`` is safe from one thread;
    ``shutdown`` is idempotent and always leaves no process and no socket files behind.
    """

    def __init__(self, cfg: CoreProcessConfig, start_timeout_s: float = 1800.0):
        self._dir = tempfile.mkdtemp(prefix="torchinferno-core-")
        addrs = CoreAddresses(f"ipc://{self._dir}/to_core", f"ipc://{self._dir}/from_core")
        self.ctx = zmq.Context(io_threads=1)
        self.to_core = self.ctx.socket(zmq.PUSH)
        self.to_core.setsockopt(zmq.SNDHWM, 0)
        self.to_core.setsockopt(zmq.LINGER, 0)
        self.to_core.connect(addrs.to_core)
        self.from_core = self.ctx.socket(zmq.PULL)
        self.from_core.setsockopt(zmq.LINGER, 0)
        self.from_core.connect(addrs.from_core)
        self._enc = encoder()
        cfg.addresses = addrs
        mp = multiprocessing.get_context("spawn")
        reader, writer = mp.Pipe(duplex=False)
        self.proc = mp.Process(target=run_engine_core, args=(cfg, writer), name="torchinferno-engine-core")
        self.proc.start()
        writer.close()
        try:
            self.info = self._handshake(reader, start_timeout_s)
        except BaseException:
            self.shutdown(timeout_s=5)
            raise
        finally:
            reader.close()

    def _handshake(self, reader, timeout_s: float) -> CoreInfo:
        deadline = time.monotonic() + timeout_s
        while not reader.poll(0.1):
            if not self.proc.is_alive():
                raise EngineCoreStartError(f"the engine core exited with status {self.proc.exitcode} while starting")
            if time.monotonic() > deadline:
                raise EngineCoreStartError(f"the engine core did not start within {timeout_s:.0f} s")
        try:
            kind, payload = reader.recv()
        except EOFError:
            self.proc.join(5)
            raise EngineCoreStartError(f"the engine core exited with status {self.proc.exitcode} while starting") from None
        if kind == "error":
            raise EngineCoreStartError(payload)
        return from_core_decoder().decode(payload)

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    def send(self, msg) -> None:
        """Queue one message for the core (never blocks)."""
        self.to_core.send(self._enc.encode(msg), zmq.NOBLOCK)

    def shutdown(self, timeout_s: float = 10.0) -> int | None:
        """Ask the core to stop, wait up to ``timeout_s``, then terminate/kill; returns its exit status."""
        if self.proc.is_alive():
            try:
                self.send(Shutdown())
            except zmq.ZMQError:
                pass
            self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        for s in (self.to_core, self.from_core):
            s.close(0)
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
        return self.proc.exitcode

    def __del__(self):  # last resort; callers shut down explicitly
        try:
            if self.proc.is_alive() and os.getpid() != self.proc.pid:
                self.proc.kill()
        except Exception:
            pass
