"""``AsyncEngine``: an ``LLMEngine`` stepped by a background thread, consumed from asyncio.

Threading model: only the engine thread touches the ``LLMEngine``. Coroutines send it commands
(add / abort) through a thread-safe queue; it drains the queue before every step, so requests
join the very next step, and hands each ``RequestOutput`` back to the waiting coroutine's event
loop with ``call_soon_threadsafe``. An event loop (e.g. an HTTP server) therefore never blocks
on a forward.

Cancellation: when a consumer stops iterating ``generate`` (``break``, task cancelled, client
disconnect) before the request finished, the generator's ``finally`` sends an abort, and the
engine thread frees the request's blocks before its next step.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import AsyncIterator

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm_engine import EngineStats, LLMEngine
from torchinferno.engine.outputs import RequestOutput
from torchinferno.errors import ConfigError, EngineDeadError

__all__ = ["AsyncEngine", "EngineDeadError"]


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class AsyncEngine:
    """Serve an ``LLMEngine`` to asyncio code. Use ``async with`` or call ``shutdown()``."""

    def __init__(self, engine: LLMEngine, idle_poll_s: float = 0.5):
        self.engine = engine
        self._idle_poll_s = idle_poll_s
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._stats = engine.stats()
        self.on_dead = None  # called once, from the engine thread, with the reason when the loop dies
        self.max_model_len = engine.max_model_len
        self._thread = threading.Thread(target=self._run, name="torchinferno-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API
    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def stats(self) -> EngineStats:
        """A snapshot published by the engine thread after each step (cheap; never blocks)."""
        return self._stats

    def num_in_flight(self) -> int:
        return len(self._streams)

    def describe(self) -> str:
        return f"in-process engine thread: {self.engine.describe()}"

    async def abort_all(self) -> None:
        """Abort every request in flight (draining at shutdown)."""
        with self._lock:
            rids = list(self._streams)
        for rid in rids:
            self._cmds.put(("abort", rid))

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams | None = None) -> AsyncIterator[RequestOutput]:
        """Stream ``RequestOutput``s of one request; the last one has ``finished=True``.

        Validation errors (``TorchInfernoError``) are raised on the first iteration, before the
        request is queued.
        """
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_token_ids]
        if not self.is_running:
            raise EngineDeadError("the engine is not running") from self._error
        self.engine.validate_request(request_id, prompt, params)  # reads only immutable config
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if request_id in self._streams:
                raise ConfigError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
        self._cmds.put(("add", request_id, prompt, params))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self._cmds.put(("abort", request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with ``finish_reason="abort"`` and its blocks are freed."""
        self._cmds.put(("abort", request_id))

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread (in-flight streams end with ``EngineDeadError``)."""
        self._stop.set()
        self._cmds.put(("wake",))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    async def __aenter__(self) -> "AsyncEngine":
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown)

    # ------------------------------------------------------------------ engine thread
    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, rid, prompt, params = cmd
            with self._lock:
                live = rid in self._streams
            if not live:  # consumer already gone
                return
            try:
                self.engine.add_request(rid, prompt, params)
            except Exception as e:  # validated before queueing; defensive
                self._deliver(rid, e)
        elif cmd[0] == "abort":
            self.engine.abort_request(cmd[1])

    def _deliver(self, rid: str, item) -> None:
        with self._lock:
            stream = self._streams.get(rid)
        if stream is None:
            return
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed
            with self._lock:
                self._streams.pop(rid, None)
            self.engine.abort_request(rid)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                busy = self.engine.has_unfinished()
                try:
                    cmd = self._cmds.get(block=not busy, timeout=None if busy else self._idle_poll_s)
                    self._apply(cmd)
                    while True:
                        self._apply(self._cmds.get_nowait())
                except queue.Empty:
                    pass
                if self._stop.is_set():
                    break
                outs = self.engine.step() if self.engine.has_unfinished() else []
                # Publish stats before delivering, so a consumer that saw its final output never
                # reads an older snapshot (e.g. blocks still in use).
                self._stats = self.engine.stats()
                for out in outs:
                    self._deliver(out.request_id, out)
        except BaseException as e:  # a bug in a step: fail every stream instead of hanging them
            self._error = e
            if self.on_dead is not None:
                self.on_dead(f"the engine stopped: {e!r}")
        finally:
            err = EngineDeadError("the engine stopped" + (f": {self._error!r}" if self._error else ""))
            with self._lock:
                rids = list(self._streams)
            for rid in rids:
                self._deliver(rid, err)
