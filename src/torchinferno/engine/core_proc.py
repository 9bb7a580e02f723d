"""The engine-core process: an ``EngineCore`` in a busy loop, fed and drained over ZeroMQ.

Started (with the ``spawn`` method) by ``engine.core_client.EngineCoreProcess``. This process binds two PUSH/PULL sockets
(``CoreAddresses``, IPC paths the API side chose and connects to), builds the model
(``engine.assembly.build_model``) and the engine, warms it up on CUDA, and reports ``CoreInfo`` (or
the one-line error that stopped it) over a ``multiprocessing`` pipe. Then it loops:

* drain every pending message (new requests, finishes, utility calls) without blocking while there is
  work, or block (up to ``IDLE_POLL_MS``) when idle;
* run one ``EngineCore.step()`` and send its outputs, with a statistics snapshot, as one message.

It never waits on HTTP, tokenization or text. It exits when told (``Shutdown``), on SIGTERM, when its
parent process is gone, or after a step raised: then it first sends ``EngineCoreOutputs(error=...)``
and exits with status 1, so the API side can fail every in-flight request at once.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from torchinferno.engine.assembly import ModelSpec
from torchinferno.engine.config import EngineConfig

__all__ = ["CoreAddresses", "CoreProcessConfig", "run_engine_core", "IDLE_POLL_MS"]

IDLE_POLL_MS = 500
UTILITY_METHODS = ("cached_prefix_tokens", "load", "reset_prefix_cache", "describe")


@dataclass(frozen=True)
class CoreAddresses:
    to_core: str  # API -> core (requests, finishes, calls)
    from_core: str  # core -> API (outputs, call results)


@dataclass
class CoreProcessConfig:
    """Everything the core process needs (picklable). ``warmup=None``: warm up on CUDA only."""

    model: ModelSpec
    engine: EngineConfig
    extra_eos_token_ids: tuple[int, ...] = ()  # the tokenizer's end-of-sequence ids
    warmup: bool | None = None
    step_log: str | None = None  # JSONL path: one line per step (engine.step_log)
    addresses: CoreAddresses = field(default_factory=lambda: CoreAddresses("", ""))
    disagg: object | None = None  # a disagg.roles.RoleConfig: this core is one role of a prefill/decode pair


def _build(cfg: CoreProcessConfig):
    from torchinferno.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_spec(cfg.model, None, cfg.engine, extra_eos_token_ids=cfg.extra_eos_token_ids)
    if engine.in_process and (cfg.warmup or (cfg.warmup is None and engine.device.type == "cuda")):
        w = engine.warmup()
        print(f"engine core warmed up in {w.seconds:.1f} s ({w.requests} throwaway requests of {w.prompt_len} tokens)",
              file=sys.stderr, flush=True)
    return engine


def run_engine_core(cfg: CoreProcessConfig, ready_conn) -> None:
    """Process entry point (module docstring)."""
    import zmq

    from torchinferno.engine.core_types import (
        CoreInfo,
        EngineCoreOutput,
        EngineCoreOutputs,
        EngineCoreRequest,
        FinishRequests,
        Shutdown,
        UtilityCall,
        UtilityResult,
        encoder,
        to_core_decoder,
    )
    from torchinferno.env import apply_platform_defaults

    apply_platform_defaults()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the whole group: the API side decides
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    parent = os.getppid()
    enc = encoder()
    dec = to_core_decoder(cfg.disagg.message_types if cfg.disagg is not None else ())
    try:
        engine = _build(cfg)
    except BaseException as e:  # report why, in one line, then exit non-zero
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        ready_conn.send(("error", f"{type(e).__name__}: {msg}" if not _is_user_error(e) else msg))
        ready_conn.close()
        raise SystemExit(1) from None
    core = engine.core
    # Everything built so far (model, block pool, warm-up leftovers) lives as long as the process: move it out of
    # the collector's generations, or each full collection walks it: 70-160 ms pauses about once a second at
    # batch 64-256 in an H200 step log.
    gc.collect()
    gc.freeze()
    try:
        role = cfg.disagg.make(core) if cfg.disagg is not None else None  # its transport connects on its own thread
    except BaseException as e:
        ready_conn.send(("error", f"disaggregation role: {type(e).__name__}: {e}"))
        ready_conn.close()
        raise SystemExit(1) from None
    described = core.describe() + (f"; {role.describe()}" if role is not None else "")
    info = CoreInfo(core.max_model_len, core.vocab_size, sorted(core.eos_token_ids), core.pool.num_blocks,
                    core.pool.block_size, core.config.max_logprobs, described, os.getpid())
    ctx = zmq.Context(io_threads=1)
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(cfg.addresses.to_core)
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.SNDHWM, 0)
    outbox.setsockopt(zmq.LINGER, 2000)
    outbox.bind(cfg.addresses.from_core)
    ready_conn.send(("ready", enc.encode(info)))
    ready_conn.close()

    def handle(msg) -> bool:
        """Apply one message; False on Shutdown."""
        if role is not None and role.handle(msg):
            return True
        if isinstance(msg, EngineCoreRequest):
            arrivals[0] += 1
            try:
                core.add_request(msg)
            except Exception:  # validated on the API side; defensively end it instead of dying
                outbox.send(enc.encode(EngineCoreOutputs([EngineCoreOutput(msg.request_id, [], "abort")])))
        elif isinstance(msg, FinishRequests):
            core.finish_requests(msg.request_ids, msg.status)
        elif isinstance(msg, UtilityCall):
            try:
                if msg.method not in UTILITY_METHODS:
                    raise ValueError(f"unknown call {msg.method!r} (valid: {', '.join(UTILITY_METHODS)})")
                res = UtilityResult(msg.call_id, getattr(core, msg.method)(*msg.args))
            except Exception as e:
                res = UtilityResult(msg.call_id, None, f"{type(e).__name__}: {e}")
            outbox.send(enc.encode(res))
        elif isinstance(msg, Shutdown):
            return False
        return True

    arrivals = [0]  # requests received since the last logged step (step log)
    log = None
    if cfg.step_log:
        from torchinferno.engine.step_log import StepLog, step_log_meta

        log = StepLog(cfg.step_log, step_log_meta(core))
        core.record_shapes = True
    clock = time.perf_counter
    idle = 0.0  # seconds waiting for requests with nothing to run since the last logged step
    status = 0
    try:
        running = True
        stalled = False  # disaggregated role: the last step scheduled nothing and nothing runs
        while running and not stopping:
            busy = core.has_unfinished()
            if role is not None:
                msgs = role.poll()
                for m in msgs:
                    outbox.send(enc.encode(m))
                if msgs:  # blocks were released or received: a fresh snapshot, and the next step may admit
                    stalled = False
                    outbox.send(enc.encode(EngineCoreOutputs([], core.stats().as_list())))
                # Transfers in flight or requests waiting for blocks: come back soon. A core whose last step
                # scheduled nothing (its waiting requests stalled on held/reserved blocks) waits too, not spins.
                if stalled:
                    busy = False
                idle_ms = 2 if role.busy() or stalled else IDLE_POLL_MS
            else:
                idle_ms = IDLE_POLL_MS
            if not busy:
                t_wait = clock()
                ready = inbox.poll(idle_ms)
                idle += clock() - t_wait
                if not ready:
                    if os.getppid() != parent:  # the API process is gone: nobody to serve
                        break
                    continue
            got = False
            while running:
                try:
                    raw = inbox.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got = True
                stalled = False
                running = handle(dec.decode(raw))
            if not running:
                break
            if core.has_unfinished():
                if log is None:
                    outs = core.step()
                else:
                    core.last_shape = core.last_launch_s = core.last_wait_s = None
                    t0 = clock()
                    outs = core.step()
                    log.record(t0, clock(), core.last_shape, len(outs), idle, core.last_launched, core.last_resolved,
                               arrivals[0], core.last_launch_s, core.last_wait_s)
                    idle = 0.0
                    arrivals[0] = 0
                stalled = role is not None and not outs and not core.scheduler.running and core._inflight is None
                outbox.send(enc.encode(EngineCoreOutputs(outs, core.stats().as_list())))
            elif got:
                outbox.send(enc.encode(EngineCoreOutputs([], core.stats().as_list())))
    except BaseException as e:  # a bug in a step: tell the API side, then die
        status = 1
        try:
            outbox.send(enc.encode(EngineCoreOutputs([], None, f"{type(e).__name__}: {e}")))
        except Exception:
            pass
        import traceback

        traceback.print_exc()
    finally:
        if role is not None:
            role.close()
        # Stop tensor-parallel workers now: a spawned process's multiprocessing exit hook joins its non-daemon
        # children (with no timeout) before atexit finalizers could tell them to stop (the API side then killed
        # this process after its shutdown timeout).
        core.executor.shutdown()
        if log is not None:
            log.close()
        inbox.close(0)
        outbox.close()
        ctx.term()
    raise SystemExit(status)


def _is_user_error(e: BaseException) -> bool:
    from torchinferno.errors import TorchInfernoError

    return isinstance(e, (TorchInfernoError, FileNotFoundError))
