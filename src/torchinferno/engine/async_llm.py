"""``AsyncLLM``: the API-server side of the engine: validation, text, streams; the core runs elsewhere.

It owns what is text and HTTP-facing: request validation (once, against the limits the core reported),
the ``OutputProcessor`` (incremental detokenization, stop strings) and one ``asyncio.Queue`` per
request. The scheduler and model run in the engine-core process (``EngineCoreProcess``); one asyncio
task receives each step's batched outputs from it, turns them into ``RequestOutput``s and hands them
to the waiting streams, and reports stop strings back to the core.

Same interface as the in-process ``AsyncEngine`` (``generate``, ``abort``, ``stats``, ``is_running``,
``shutdown``), so the server's routes do not care which one they drive.

Faults: when the core process exits or reports an error, every live stream raises ``EngineDeadError``
at once, later calls raise it immediately, and ``on_dead`` (if set) is called once with the reason.
Aborts: a consumer that stops iterating ``generate`` before the end aborts its request; the core frees
its KV blocks when the message arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator, Callable

import zmq
import zmq.asyncio

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.assembly import ModelSpec
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineStats, RequestLimits, validate_request
from torchinferno.engine.core_client import EngineCoreProcess
from torchinferno.engine.core_proc import CoreProcessConfig
from torchinferno.engine.core_streams import CoreStreams
from torchinferno.engine.core_types import (
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishRequests,
    UtilityResult,
    from_core_decoder,
)
from torchinferno.engine.output_processor import OutputProcessor
from torchinferno.engine.outputs import RequestOutput
from torchinferno.errors import ConfigError, EngineDeadError

__all__ = ["AsyncLLM", "EngineDeadError"]


class AsyncLLM(CoreStreams):
    """Serve a model whose engine core runs in its own process (module docstring).

    Construct it before the event loop serves requests (it blocks until the core is ready: the model is
    loaded there); the receiving task starts on first use inside the running loop.
    """

    def __init__(self, model: ModelSpec, engine_config: EngineConfig, tokenizer, warmup: bool | None = None,
                 start_timeout_s: float = 1800.0, step_log: str | None = None):
        cfg = CoreProcessConfig(model, engine_config, tuple(getattr(tokenizer, "eos_token_ids", ()) or ()), warmup,
                                step_log)
        self.core = EngineCoreProcess(cfg, start_timeout_s)
        info = self.core.info
        self.info = info
        self.max_model_len = info.max_model_len
        self.limits = RequestLimits(info.max_model_len, info.vocab_size, info.max_logprobs)
        self.tokenizer = tokenizer
        self.outputs = OutputProcessor(tokenizer)
        self.on_dead: Callable[[str], None] | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._next_call = 0
        self._stats = EngineStats(0, 0, 0.0, info.num_blocks, info.block_size, info.num_blocks, 0, 0, 0, 0, 0, 0, 0,
                                  0, 0, 0, 0, 0, 0)
        self._error: str | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task | None = None

    # ------------------------------------------------------------------ state
    @property
    def is_running(self) -> bool:
        return self._error is None and not self._closed and self.core.is_alive()

    def stats(self) -> EngineStats:
        """The snapshot the core sent with its latest step (cheap; never blocks)."""
        return self._stats

    def describe(self) -> str:
        return f"engine core pid {self.info.pid}: {self.info.description}"

    # ------------------------------------------------------------------ requests
    def _start(self) -> None:
        """Wrap the receive socket for the running loop and start the receiving task and the death watch
        (once per event loop: a new loop, e.g. a second ``asyncio.run``, gets its own)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            raise RuntimeError("AsyncLLM is in use by another running event loop")
        self._loop = loop
        sock = zmq.asyncio.Socket.from_socket(self.core.from_core)
        self._reader = loop.create_task(self._receive(sock))
        loop.add_reader(self.core.proc.sentinel, self._on_exit)
        if not self.core.is_alive():
            self._on_exit()

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams | None = None) -> AsyncIterator[RequestOutput]:
        """Stream ``RequestOutput``s of one request; the last one has ``finished=True``.

        Validation errors (``TorchInfernoError``) are raised on the first iteration, before the
        request is sent to the core. A consumer that falls behind the core gets the outputs it missed merged
        into one (``RequestOutput.merged_with``): fewer, larger deltas, nothing lost (requests without logprobs).
        """
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_token_ids]
        self._check_running()
        validate_request(self.limits, prompt, params)
        if request_id in self._queues:
            raise ConfigError(f"request id {request_id!r} is already in use")
        self._start()
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        self.outputs.add_request(request_id, prompt, params)
        self.core.send(EngineCoreRequest(request_id, prompt, params, time.monotonic()))
        async with contextlib.aclosing(self._stream(request_id, queue)) as stream:  # closed at once on an early stop
            async for item in stream:
                yield item

    def _abort_local(self, request_id: str) -> bool:
        if self.outputs.abort(request_id) is None:
            return False
        if self.is_running:
            self.core.send(FinishRequests([request_id], "abort"))
        return True

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with ``finish_reason="abort"`` and the core frees its blocks."""
        out = self.outputs.abort(request_id)
        if out is None:
            return
        if self.is_running:
            self.core.send(FinishRequests([request_id], "abort"))
        q = self._queues.get(request_id)
        if q is not None:
            q.put_nowait(out)

    async def call(self, method: str, *args):
        """Call one of the core's utility methods (``core_proc.UTILITY_METHODS``) and wait for the result."""
        return await self._call_on(self.core, method, args)

    # ------------------------------------------------------------------ receiving
    async def _receive(self, sock) -> None:
        dec = from_core_decoder()
        queues = self._queues
        try:
            while True:
                msg = dec.decode(await sock.recv())
                if isinstance(msg, EngineCoreOutputs):
                    if msg.stats is not None:
                        self._stats = EngineStats(*msg.stats)
                    if msg.error is not None:
                        self._fail(f"the engine core failed: {msg.error}")
                        return
                    results, stopped = self.outputs.process(msg.outputs)
                    if stopped:
                        self.core.send(FinishRequests(stopped, "stop"))
                    for r in results:
                        q = queues.get(r.request_id)
                        if q is not None:
                            q.put_nowait(r)
                elif isinstance(msg, UtilityResult):
                    self._resolve_call(msg)
        except (asyncio.CancelledError, zmq.ZMQError):
            return

    def _on_exit(self) -> None:
        """The core process exited (the sentinel became readable)."""
        if self._loop is not None:
            self._loop.remove_reader(self.core.proc.sentinel)
        if self._closed:
            return
        self.core.proc.join(1)
        self._fail(f"the engine core process exited (status {self.core.proc.exitcode})")

    # ------------------------------------------------------------------ teardown
    def shutdown(self, timeout_s: float = 10.0) -> int | None:
        """Stop the core process (in-flight streams end with ``EngineDeadError``); returns its exit status."""
        if self._closed:
            return self.core.proc.exitcode
        self._closed = True
        self._stop_loop()
        return self.core.shutdown(timeout_s)

    def _teardown_in_loop(self) -> None:
        try:
            self._loop.remove_reader(self.core.proc.sentinel)
        except Exception:
            pass
        if self._reader is not None:
            self._reader.cancel()
        self._fail("the engine was shut down")
