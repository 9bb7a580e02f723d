"""``DisaggLLM``: the API side of prefill/decode disaggregation, with ``AsyncLLM``'s interface.

Two engine-core processes (``EngineCoreProcess``), role ``prefill`` and role ``decode``, each a normal engine core
plus its role (``disagg.roles``), joined by a two-rank KV transport (``disagg.transport``). This object relays the
control messages between them (``disagg.messages``) and owns text and streams, as ``AsyncLLM`` does:

* a request goes to the prefill core with ``max_tokens = 1`` and the client's sampling parameters (seed included),
  so its first token is the one a colocated engine samples; that token is streamed at once (time to first token
  is the prefill role's);
* unless that finished it (stop token, stop string, ``max_tokens == 1``, context full: its held KV is then
  released), it is handed to the decode core, which continues it in its continuous batch; every later token
  comes from there. The prefill core meanwhile prefills the next requests (overlap);
* one abort path: the request is finished wherever it is (prefill core, decode queue, in transfer, decoding).

Tensor parallelism: with ``engine_config.tensor_parallel_size = N`` each role is an N-rank TP engine (its workers
spawned by the core's ``MultiprocExecutor``); both roles use the same N, and prefill TP rank ``i`` hands its KV
shard to decode TP rank ``i`` over pair ``i`` (``disagg.sharding``: a replicated MLA tensor crosses once, on its
owner rank's pair, and is broadcast among the decode ranks). A role's devices: ``cpu`` (all ranks), or a comma list of N CUDA
devices (``cuda:0,cuda:1``).

Faults: the prefill core dying is fatal (``on_dead``; streams fail with ``EngineDeadError``). The decode core dying
fails the requests it owned (or was about to receive) with a clear ``EngineDeadError``, releases their held KV on
the prefill side, and the server keeps serving: later requests run colocated on the prefill core
(``decode_alive`` is False, ``describe()`` and the integrity record say so).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.disagg.accounting import (
    KVTransferTotals,
    RequestTransfer,
    TransferLedger,
)
from torchinferno.disagg.launch import DisaggConfig, plan_pair, start_role_cores
from torchinferno.disagg.messages import (
    FROM_DECODE,
    FROM_PREFILL,
    KVDecode,
    KVDropped,
    KVPrefill,
    KVReady,
    KVReceived,
    KVRelease,
    KVSend,
    KVSent,
)
from torchinferno.engine.core import EngineStats, RequestLimits, validate_request
from torchinferno.engine.core_streams import CoreStreams
from torchinferno.engine.core_types import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishRequests,
    UtilityResult,
    from_core_decoder,
)
from torchinferno.engine.output_processor import OutputProcessor
from torchinferno.errors import ConfigError, EngineDeadError

__all__ = ["DisaggConfig", "DisaggLLM", "KVTransferTotals"]


@dataclass
class _Live:
    prompt: list[int]
    params: SamplingParams
    phase: str  # "prefill" | "decode" | "colocated"
    transfer_id: int = 0
    readied: bool = False  # the decode core reserved blocks and asked for the rows
    kv: RequestTransfer = field(default_factory=RequestTransfer)


class DisaggLLM(CoreStreams):
    """Serve one model as a prefill/decode pair (module docstring). Same interface as ``AsyncLLM``."""

    def __init__(self, model, engine_config, tokenizer, disagg: DisaggConfig, warmup: bool | None = None,
                 start_timeout_s: float = 1800.0, step_log: str | None = None):
        plan = plan_pair(engine_config, disagg)
        self.tp, self.devices, self.backends = plan.tp, plan.devices, plan.backends  # backends: per KV pair
        self.backend = plan.backend
        self.cfg = disagg
        self.cores = start_role_cores(plan, model, engine_config, tokenizer, disagg, warmup, start_timeout_s, step_log)
        self.prefill, self.decode = self.cores["prefill"], self.cores.get("decode")
        pi, di = self.prefill.info, self.decode.info
        self.info = pi
        self.max_model_len = min(pi.max_model_len, di.max_model_len)
        self.limits = RequestLimits(self.max_model_len, pi.vocab_size, pi.max_logprobs)
        self.tokenizer = tokenizer
        self.outputs = OutputProcessor(tokenizer)
        self.on_dead: Callable[[str], None] | None = None
        self.decode_alive = True
        self.ledger = TransferLedger(disagg.record_path, disagg.profile)
        self._live: dict[str, _Live] = {}
        self._queues: dict[str, asyncio.Queue] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._next_call = 0
        self._next_transfer = 0
        self._stats = {r: EngineStats(0, 0, 0.0, i.num_blocks, i.block_size, i.num_blocks, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                      0, 0, 0, 0) for r, i in (("prefill", pi), ("decode", di))}
        self._error: str | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ state
    @property
    def is_running(self) -> bool:
        return self._error is None and not self._closed and self.prefill.is_alive()

    def stats(self) -> EngineStats:
        """Both roles' latest snapshots, summed (``kv_usage``: the decode role's while it lives)."""
        p, d = self._stats["prefill"], self._stats["decode"]
        vals = [a + b for a, b in zip(p.as_list(), d.as_list())]
        s = EngineStats(*vals)
        s.kv_usage = d.kv_usage if self.decode_alive else p.kv_usage
        s.block_size = p.block_size
        s.max_batch_seqs, s.max_batch_tokens = max(p.max_batch_seqs, d.max_batch_seqs), max(p.max_batch_tokens,
                                                                                            d.max_batch_tokens)
        return s

    def role_stats(self) -> dict[str, EngineStats]:
        return dict(self._stats)

    def topology(self) -> dict:
        """Roles, their TP size and per-rank devices, and the KV pairs (prefill rank i -> decode rank i)."""
        pairs = [{"prefill_rank": i, "decode_rank": i, "prefill_device": p, "decode_device": d, "backend": b}
                 for i, (p, d, b) in enumerate(zip(self.devices["prefill"], self.devices["decode"], self.backends))]
        return {"mode": "prefill-decode", "tensor_parallel_size": self.tp,
                "prefill": {"device": self.cfg.prefill_device, "devices": self.devices["prefill"],
                            "pid": self.prefill.pid, "tensor_parallel_size": self.tp},
                "decode": {"device": self.cfg.decode_device, "devices": self.devices["decode"], "pid": self.decode.pid,
                           "tensor_parallel_size": self.tp, "alive": self.decode_alive},
                "kv_pairs": pairs,
                "replicated_kv": ("each replicated tensor crosses once, on its owner rank's pair; broadcast among the "
                                  "decode ranks") if self.tp > 1 else None}

    def describe(self) -> str:
        state = "" if self.decode_alive else " (decode role gone: serving colocated on the prefill role)"
        tp = f", tensor-parallel {self.tp} + {self.tp} ranks ({self.tp} KV pairs)" if self.tp > 1 else ""
        return (f"prefill/decode disaggregation over {self.backend}{tp}{state}; prefill core pid {self.prefill.pid} on "
                f"{self.cfg.prefill_device}: {self.prefill.info.description}; decode core pid {self.decode.pid} on "
                f"{self.cfg.decode_device}: {self.decode.info.description}")

    @property
    def totals(self) -> KVTransferTotals:
        return self.ledger.totals

    def bind_metrics(self, metrics) -> None:
        """KV transfer bytes / seconds / outcomes in the server's ``/metrics`` (``disagg.accounting``)."""
        self.ledger.bind_metrics(metrics)

    # ------------------------------------------------------------------ requests
    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            raise RuntimeError("DisaggLLM is in use by another running event loop")
        self._loop = loop
        for role, core in self.cores.items():
            sock = zmq.asyncio.Socket.from_socket(core.from_core)
            self._tasks.append(loop.create_task(self._receive(role, sock)))
            loop.add_reader(core.proc.sentinel, self._on_exit, role)
            if not core.is_alive():
                self._on_exit(role)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams | None = None) -> AsyncIterator:
        """Stream ``RequestOutput``s of one request (as ``AsyncLLM.generate``)."""
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_token_ids]
        self._check_running()
        validate_request(self.limits, prompt, params)
        if request_id in self._queues or request_id in self._live:
            raise ConfigError(f"request id {request_id!r} is already in use")
        self._start()
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        self.outputs.add_request(request_id, prompt, params)
        now = time.monotonic()
        if self.decode_alive and params.prompt_logprobs is None:
            self._live[request_id] = _Live(prompt, params, "prefill")
            first = dataclasses.replace(params, max_tokens=1)
            self.prefill.send(KVPrefill(EngineCoreRequest(request_id, prompt, first, now)))
        else:  # colocated on the prefill role (decode role gone; prompt logprobs stay where they are computed)
            self._live[request_id] = _Live(prompt, params, "colocated")
            self.prefill.send(EngineCoreRequest(request_id, prompt, params, now))
        async with contextlib.aclosing(self._stream(request_id, queue)) as stream:  # closed at once on an early stop
            async for item in stream:
                yield item

    def _abort_local(self, request_id: str):
        out = self.outputs.abort(request_id)
        live = self._live.pop(request_id, None)
        if live is not None and self.is_running:
            core = self.decode if live.phase == "decode" and self.decode_alive else self.prefill
            if live.phase != "decode" or self.decode_alive:
                core.send(FinishRequests([request_id], "abort"))
        return out

    async def abort(self, request_id: str) -> None:
        out = self._abort_local(request_id)
        q = self._queues.get(request_id)
        if out is not None and q is not None:
            q.put_nowait(out)

    async def call(self, method: str, *args):
        """A utility call on the prefill core (``cached_prefix_tokens``, ``load``, ...)."""
        return await self._call_on(self.prefill, method, args)

    # ------------------------------------------------------------------ receiving
    def _deliver(self, results) -> None:
        for r in results:
            q = self._queues.get(r.request_id)
            if q is not None:
                q.put_nowait(r)
            if r.finished:
                live = self._live.pop(r.request_id, None)
                if live is not None:
                    self.ledger.finished(r.request_id, r.finish_reason, len(live.prompt), live.phase == "decode",
                                         live.kv, self.topology(), self.backend)

    def _prefill_outputs(self, outs: list[EngineCoreOutput]) -> None:
        for o in outs:
            live = self._live.get(o.request_id)
            if live is None or live.phase != "prefill":
                if live is None and o.finish_reason not in (None, "abort"):
                    self.prefill.send(KVRelease([o.request_id]))  # aborted meanwhile: its KV was held
                if live is not None:  # colocated
                    results, stopped = self.outputs.process([o])
                    if stopped:
                        self.prefill.send(FinishRequests(stopped, "stop"))
                    self._deliver(results)
                continue
            if o.finish_reason is None:
                continue  # cannot happen (max_tokens 1): a prefill output finishes
            hand_off = (o.finish_reason == "length" and live.params.max_tokens > 1 and self.decode_alive
                        and len(live.prompt) + 1 < self.max_model_len)
            if not hand_off:
                if o.finish_reason != "abort":
                    self.prefill.send(KVRelease([o.request_id]))
                results, _ = self.outputs.process([o])
                self._deliver(results)
                continue
            o = EngineCoreOutput(o.request_id, o.new_token_ids, None, None, o.num_cached_tokens, o.logprobs,
                                 o.prompt_logprobs)
            results, stopped = self.outputs.process([o])
            if stopped:  # a stop string in the first token's text: finished here
                self.prefill.send(KVRelease([o.request_id]))
                self._deliver(results)
                continue
            self._next_transfer += 1
            live.phase, live.transfer_id = "decode", self._next_transfer
            self.decode.send(KVDecode(EngineCoreRequest(o.request_id, live.prompt, live.params, time.monotonic()),
                                      o.new_token_ids[0], live.transfer_id))
            self._deliver(results)

    def _on_transfer(self, msg) -> None:
        if isinstance(msg, KVReady):
            live = self._live.get(msg.request_id)
            if live is not None:
                live.readied = True
            self.prefill.send(KVSend(msg.request_id, msg.transfer_id, msg.start, msg.stop))  # always: keeps order
        elif isinstance(msg, KVDropped):
            self.prefill.send(KVRelease([msg.request_id]))
        elif isinstance(msg, KVSent):
            live = self._live.get(msg.request_id)
            self.ledger.sent(msg, live.kv if live is not None else None)
        elif isinstance(msg, KVReceived):
            live = self._live.get(msg.request_id)
            self.ledger.received(msg, live.kv if live is not None else None)
            if not msg.ok and live is not None:
                self._fail_request(msg.request_id, f"KV transfer to the decode role failed: {msg.error}")

    def _fail_request(self, rid: str, reason: str) -> None:
        self._live.pop(rid, None)
        self.outputs.abort(rid)
        q = self._queues.get(rid)
        if q is not None:
            q.put_nowait(EngineDeadError(reason))

    async def _receive(self, role: str, sock) -> None:
        dec = from_core_decoder(FROM_PREFILL if role == "prefill" else FROM_DECODE)
        core = self.cores[role]
        try:
            while True:
                msg = dec.decode(await sock.recv())
                if isinstance(msg, EngineCoreOutputs):
                    if msg.stats is not None:
                        self._stats[role] = EngineStats(*msg.stats)
                    if msg.error is not None:
                        self._role_failed(role, f"the {role} engine core failed: {msg.error}")
                        return
                    if role == "prefill":
                        self._prefill_outputs(msg.outputs)
                    else:
                        results, stopped = self.outputs.process(msg.outputs)
                        if stopped:
                            core.send(FinishRequests(stopped, "stop"))
                        self._deliver(results)
                elif isinstance(msg, UtilityResult):
                    self._resolve_call(msg)
                else:
                    self._on_transfer(msg)
        except (asyncio.CancelledError, zmq.ZMQError):
            return

    def _on_exit(self, role: str) -> None:
        core = self.cores[role]
        if self._loop is not None:
            self._loop.remove_reader(core.proc.sentinel)
        if self._closed:
            return
        core.proc.join(1)
        self._role_failed(role, f"the {role} engine core process exited (status {core.proc.exitcode})")

    def _role_failed(self, role: str, reason: str) -> None:
        if role == "prefill":
            self._fail(reason)
            return
        if not self.decode_alive:
            return
        self.decode_alive = False
        # Requests the decode role owned, or was going to: they fail; held KV of those never sent is released.
        lost = [rid for rid, live in self._live.items() if live.phase in ("decode", "prefill")]
        release = [rid for rid in lost if not self._live[rid].readied]
        for rid in lost:
            self._fail_request(rid, f"{reason} while it served this request")
        if release and self.prefill.is_alive():
            self.prefill.send(KVRelease(release))

    def _forget_requests(self) -> None:
        self._live.clear()

    # ------------------------------------------------------------------ teardown
    def shutdown(self, timeout_s: float = 10.0) -> int | None:
        if self._closed:
            return self.prefill.proc.exitcode
        self._closed = True
        self._stop_loop()
        status = None
        for role in ("decode", "prefill"):
            s = self.cores[role].shutdown(timeout_s)
            status = s if role == "prefill" else status
        self.ledger.close()
        return status

    def _teardown_in_loop(self) -> None:
        for core in self.cores.values():
            try:
                self._loop.remove_reader(core.proc.sentinel)
            except (ValueError, OSError, RuntimeError):
                pass
        for t in self._tasks:
            t.cancel()
        self._fail("the engine was shut down")
