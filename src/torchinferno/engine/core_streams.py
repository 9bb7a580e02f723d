"""``CoreStreams``: what every API-side client of engine-core processes shares (``AsyncLLM`` over one core,
``disagg.client.DisaggLLM`` over a prefill and a decode core): one ``asyncio.Queue`` per request and the stream
that drains it, utility calls and their futures, failing everything at once, and the teardown of its event loop.

A subclass sets ``_queues``, ``_calls``, ``_next_call``, ``_error``, ``_closed``, ``_loop``, ``outputs`` and
``on_dead`` in its constructor and provides ``is_running``, ``abort(request_id)``, ``_abort_local(request_id)`` and
``_teardown_in_loop()``. Invariant: after ``_fail`` every live stream raises ``EngineDeadError`` and every pending
call fails with it; ``on_dead`` is called once, unless the client was shut down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from torchinferno.engine.core_types import UtilityCall, UtilityResult
from torchinferno.engine.outputs import RequestOutput
from torchinferno.errors import EngineDeadError

__all__ = ["CoreStreams"]


class CoreStreams:
    """Mixin of the API-side engine clients (module docstring)."""

    @property
    def error(self) -> str | None:
        return self._error

    def num_in_flight(self) -> int:
        return len(self._queues)

    def _check_running(self) -> None:
        if not self.is_running:
            raise EngineDeadError(f"the engine is not running{': ' + self._error if self._error else ''}")

    async def _stream(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs until the finished one; a consumer that stops early aborts the request.
        A consumer that falls behind gets the outputs it missed merged into one (``RequestOutput.merged_with``):
        fewer, larger deltas, nothing lost (requests without logprobs)."""
        finished = False
        pending = None
        try:
            while True:
                item, pending = (pending, None) if pending is not None else (await queue.get(), None)
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                # Behind: merge the backlog into one delta. Not with logprobs: their text offsets need each
                # token's own text delta (server/logprobs.py), which a merged output no longer has.
                while not item.finished and item.logprobs is None and not queue.empty():
                    nxt = queue.get_nowait()
                    if isinstance(nxt, BaseException):
                        pending = nxt
                        break
                    item = item.merged_with(nxt)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._abort_local(request_id)

    async def abort_all(self) -> None:
        """Abort every request in flight (draining at shutdown)."""
        for rid in list(self._queues):
            await self.abort(rid)

    async def _call_on(self, core, method: str, args: tuple):
        """Call one of ``core``'s utility methods (``core_proc.UTILITY_METHODS``) and wait for the result."""
        self._check_running()
        self._start()
        self._next_call += 1
        fut = asyncio.get_running_loop().create_future()
        self._calls[self._next_call] = fut
        core.send(UtilityCall(self._next_call, method, list(args)))
        return await fut

    def _resolve_call(self, msg: UtilityResult) -> None:
        fut = self._calls.pop(msg.call_id, None)
        if fut is not None and not fut.done():
            if msg.error is None:
                fut.set_result(msg.result)
            else:
                fut.set_exception(RuntimeError(msg.error))

    def _fail(self, reason: str) -> None:
        """Fail every stream and call with ``EngineDeadError(reason)``, once."""
        if self._error is not None:
            return
        self._error = reason
        err = EngineDeadError(reason)
        for rid, q in list(self._queues.items()):
            self.outputs.abort(rid)
            q.put_nowait(err)
        self._forget_requests()
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(err)
        self._calls.clear()
        if self.on_dead is not None and not self._closed:
            self.on_dead(reason)

    def _forget_requests(self) -> None:
        """Drop per-request state a subclass keeps beyond the queues (on ``_fail``)."""

    def _stop_loop(self) -> None:
        """Shutdown's event-loop part: tear down in the loop (now, or from another thread through the loop), or,
        with no loop, just fail what is left."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                in_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                in_loop = False
            if in_loop or not loop.is_running():
                self._teardown_in_loop()
            else:
                loop.call_soon_threadsafe(self._teardown_in_loop)
        else:
            self._fail("the engine was shut down")
