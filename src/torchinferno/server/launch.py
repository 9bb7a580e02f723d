"""Build the engine + tokenizer + app from the server flags, and run uvicorn with draining and fault handling.

By default the engine core (scheduler + model) runs in its own process (``engine.async_llm.AsyncLLM``):
this process only parses, validates, tokenizes, detokenizes and streams. ``--engine-in-process`` keeps the
older single-process layout (an ``AsyncEngine`` thread) for debugging and profiling.

Lifecycle (``serve``):

* SIGTERM: new requests get 503 at once; in-flight requests may finish for ``--shutdown-grace-period``
  seconds; what is left is aborted (streams end with ``finish_reason: "abort"``); the process exits 0.
  A second SIGTERM/SIGINT stops at once.
* the engine core dies: ``/health`` and new requests answer 503, every in-flight request ends with an
  OpenAI error (a stream: an error event, then ``[DONE]``), and the process exits 1 (a supervisor restarts it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys

from torchinferno.errors import ConfigError
from torchinferno.server.args import (
    add_server_args,
    disagg_config_from_args,
    engine_config_from_args,
    model_spec_from_args,
    served_name,
)

__all__ = ["add_server_args", "build", "serve"]


def _model_context_len(spec) -> int | None:
    """The model's context length, read without building it (config.json, or the tiny size's config)."""
    if spec.model_kind is not None:
        from torchinferno.models.registry import get_family

        return get_family(spec.model_kind).size(spec.size).max_position_embeddings
    from torchinferno.checkpoint.safetensors_io import read_config

    cfg = read_config(spec.checkpoint_dir())
    return cfg.get("max_position_embeddings")


def build(args: argparse.Namespace):
    """-> (app, ServerConfig, engine): ``engine`` is an ``AsyncLLM`` (engine-core process) or, with
    ``--engine-in-process``, an ``AsyncEngine``."""
    from torchinferno.core.generation_defaults import load_sampling_defaults
    from torchinferno.engine.assembly import check_device, tokenizer_spec
    from torchinferno.server.app import ServerConfig, create_app
    from torchinferno.text.tokenizer import load_tokenizer

    check_device(args.device)
    spec = model_spec_from_args(args)
    root = str(spec.checkpoint_dir()) if spec.model is not None else f"random:{spec.model_kind}"
    if spec.model_kind is not None and args.tokenizer is None:
        tokenizer = _random_model_tokenizer(spec)
    else:
        tokenizer = load_tokenizer(tokenizer_spec(spec, args.tokenizer, None if spec.model is None else root))
    cfg = engine_config_from_args(args, _model_context_len(spec))
    defaults = load_sampling_defaults(getattr(args, "generation_config", "auto"), None if spec.model is None else root)
    if getattr(args, "data_parallel_size", 1) < 1:
        raise ConfigError(f"--data-parallel-size must be >= 1 (got {args.data_parallel_size})")
    disagg = disagg_config_from_args(args)
    if disagg is not None:
        if getattr(args, "data_parallel_size", 1) > 1:
            raise ConfigError("--disaggregation-mode prefill-decode runs one prefill and one decode engine: "
                              "leave out --data-parallel-size")
        from torchinferno.disagg.client import DisaggLLM

        check_device(disagg.prefill_device)
        check_device(disagg.decode_device)
        engine = DisaggLLM(spec, cfg, tokenizer, disagg, step_log=args.step_log)
        max_len = engine.max_model_len
    elif args.engine_in_process:
        if getattr(args, "data_parallel_size", 1) > 1:
            raise ConfigError("--data-parallel-size needs engine-core processes (leave out --engine-in-process)")
        if args.step_log:
            raise ConfigError("--step-log needs the engine-core process (leave out --engine-in-process)")
        engine = _in_process_engine(spec, cfg, tokenizer)
        max_len = engine.engine.max_model_len
    elif getattr(args, "data_parallel_size", 1) > 1:
        from torchinferno.engine.dp_llm import DataParallelLLM

        engine = DataParallelLLM.from_spec(spec, cfg, tokenizer, args.data_parallel_size, args.router_policy,
                                           step_log=args.step_log)
        max_len = engine.max_model_len
    else:
        from torchinferno.engine.async_llm import AsyncLLM

        engine = AsyncLLM(spec, cfg, tokenizer, step_log=args.step_log)
        max_len = engine.max_model_len
    print(f"engine: {engine.describe()}", file=sys.stderr, flush=True)
    if note := defaults.describe():
        print(note, file=sys.stderr, flush=True)
    scfg = ServerConfig(model_name=served_name(args, spec), root=root, max_model_len=max_len, api_key=args.api_key,
                        max_request_body_bytes=args.max_request_body_bytes,
                        max_choices_per_request=args.max_choices_per_request, sampling_defaults=defaults)
    return create_app(engine, tokenizer, scfg), scfg, engine


def _random_model_tokenizer(spec):
    """Bytes in; every id of the random model's vocabulary decodes to text (``testing.wide_byte_tokenizer``),
    so a full-size random model streams visible text like a real one."""
    from torchinferno.models.registry import get_family
    from torchinferno.testing import wide_byte_tokenizer

    return wide_byte_tokenizer(get_family(spec.model_kind).size(spec.size).vocab_size)


def _in_process_engine(spec, cfg, tokenizer):
    from torchinferno.engine.async_engine import AsyncEngine
    from torchinferno.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_spec(spec, tokenizer, cfg)
    if engine.in_process and engine.device.type == "cuda":  # kernel compiles at startup, not in the first requests' latency
        w = engine.warmup()
        print(f"warmed up in {w.seconds:.1f} s ({w.requests} throwaway requests of {w.prompt_len} tokens)", flush=True)
    return AsyncEngine(engine)


def _make_server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn, with SIGTERM draining the engine first (module docstring) and ``exit_code``."""

        def __init__(self, config, app, engine, grace_s: float):
            super().__init__(config)
            self.app_state, self.engine, self.grace_s = app.state, engine, grace_s
            self.exit_code = 0
            self._loop: asyncio.AbstractEventLoop | None = None
            self._draining = False

        async def startup(self, sockets=None):
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets)

        def handle_exit(self, sig, frame):
            if sig == signal.SIGTERM and not self._draining and self._loop is not None:
                self._draining = True
                self.app_state.draining = True
                self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain()))
                return
            super().handle_exit(sig, frame)

        async def _drain(self) -> None:
            deadline = self._loop.time() + self.grace_s
            while self.engine.num_in_flight() and self._loop.time() < deadline:
                await asyncio.sleep(0.05)
            await self.engine.abort_all()
            for _ in range(40):  # let the aborted streams write their last chunks
                if not self.engine.num_in_flight():
                    break
                await asyncio.sleep(0.05)
            self.should_exit = True

        def engine_died(self, reason: str) -> None:
            """Called once by the engine (from any thread) when it stopped serving."""
            print(f"error: {reason}; exiting", file=sys.stderr, flush=True)
            self.exit_code = 1
            # Leave a moment for in-flight streams to write their error event and [DONE].
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.call_later, 0.5, setattr, self, "should_exit", True)
            else:
                self.should_exit = True

    return DrainingServer


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    app, cfg, engine = build(args)
    server = _make_server_class()(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level),
                                  app, engine, args.shutdown_grace_period)
    engine.on_dead = server.engine_died
    gc.collect()  # the app, tokenizer and (in-process) engine live as long as the server: keep them out of
    gc.freeze()  # every full collection (see engine/core_proc.py)
    print(f"serving '{cfg.model_name}' on http://{args.host}:{args.port} (max_model_len {cfg.max_model_len})", flush=True)
    try:
        server.run()
    finally:
        engine.shutdown()
    return server.exit_code
