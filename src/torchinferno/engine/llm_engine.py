"""``LLMEngine``: add requests, call ``step()``, get per-request outputs (continuous batching), in process.

An ``EngineCore`` (scheduler + block pool + executor, tokens only) plus an ``OutputProcessor`` (text,
stop strings) in one thread: the offline ``LLM`` and the tests drive this; the server runs the same
``EngineCore`` in its own process (``engine/core_proc.py``) and the same ``OutputProcessor`` in the API
process (``engine/async_llm.py``). See ``engine/core.py`` for the step and async-scheduling invariants.

A request ended by a stop string is finished in the core right away (before the next step is
scheduled); with async scheduling its in-flight step's result for it is dropped.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore, EngineStats, RequestLimits, validate_request
from torchinferno.engine.core_types import EngineCoreRequest
from torchinferno.engine.executor import UniprocExecutor
from torchinferno.engine.output_processor import OutputProcessor
from torchinferno.engine.outputs import RequestOutput
from torchinferno.errors import ConfigError

__all__ = ["LLMEngine", "EngineStats"]


class LLMEngine:
    """A single-replica serving engine over ``model`` (any family: built via the protocol).

    End-of-sequence ids: the model config's, the tokenizer's and ``extra_eos_token_ids``.
    """

    def __init__(self, model: nn.Module | None, tokenizer=None, config: EngineConfig | None = None, *,
                 extra_eos_token_ids=(), executor=None, **overrides):
        """``executor``: an already started ``Executor`` (e.g. ``MultiprocExecutor``: ``model`` is then None and
        the model's config comes from ``executor.model_config``); default: an in-process ``UniprocExecutor``."""
        if config is None:
            config = EngineConfig(**overrides)
        elif overrides:
            raise ConfigError("pass either config or keyword overrides, not both")
        if isinstance(tokenizer, str):
            from torchinferno.text.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.model = model
        self.tokenizer = tokenizer
        self.executor = executor if executor is not None else UniprocExecutor(model, replace(config))
        model_config = model.config if model is not None else self.executor.model_config
        eos = set(getattr(model_config, "eos_token_ids", []) or []) | set(extra_eos_token_ids)
        if tokenizer is not None:
            eos |= set(tokenizer.eos_token_ids)
        self.core = EngineCore(self.executor, eos, getattr(model_config, "vocab_size", None))
        self.outputs = OutputProcessor(tokenizer)
        self._pending: list[RequestOutput] = []  # abort outputs reported by the next step

    @classmethod
    def from_spec(cls, spec, tokenizer=None, config: EngineConfig | None = None, *,
                  extra_eos_token_ids=()) -> LLMEngine:
        """The engine of an ``engine.assembly.ModelSpec``: built here, or with ``config.tensor_parallel_size > 1``
        on that many worker processes (``engine.multiproc_executor``; the model is never built here), or on this
        torchrun rank's shard (``engine.torchrun_executor``)."""
        config = config or EngineConfig()
        if config.tensor_parallel_size == 1 and config.pipeline_parallel_size == 1:
            from torchinferno.engine.assembly import build_model

            return cls(build_model(spec), tokenizer, config, extra_eos_token_ids=extra_eos_token_ids)
        from torchinferno.engine.torchrun_executor import parallel_executor

        return cls(None, tokenizer, config, extra_eos_token_ids=extra_eos_token_ids,
                   executor=parallel_executor(spec, replace(config)))

    @property
    def in_process(self) -> bool:
        """The model runs in this process (runner, KV cache and warm-up are reachable)."""
        return isinstance(self.executor, UniprocExecutor)

    # The parts, for introspection, warm-up and tests.
    config = property(lambda self: self.executor.config)
    device = property(lambda self: self.executor.device)
    kv_cache = property(lambda self: self.executor.kv_cache)
    runner = property(lambda self: self.executor.runner)
    scheduler = property(lambda self: self.core.scheduler)
    pool = property(lambda self: self.core.pool)
    max_model_len = property(lambda self: self.core.max_model_len)
    vocab_size = property(lambda self: self.core.vocab_size)
    eos_token_ids = property(lambda self: self.core.eos_token_ids)

    @property
    def limits(self) -> RequestLimits:
        return self.core.limits

    # ------------------------------------------------------------------ requests
    def validate_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise a ``TorchInfernoError`` for anything the engine cannot serve (boundary check)."""
        validate_request(self.core.limits, prompt_token_ids, params)
        if request_id in self.outputs:
            raise ConfigError(f"request id {request_id!r} is already in use")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_token_ids]
        self.validate_request(request_id, prompt, params)
        self.core.add_request(EngineCoreRequest(request_id, prompt, params, arrival_time))
        self.outputs.add_request(request_id, prompt, params)

    def abort_request(self, request_id: str) -> bool:
        """Abort a live request and free its blocks now; the next ``step()`` reports it finished."""
        out = self.outputs.abort(request_id)
        if out is None:
            return False
        self.core.finish_requests([request_id], "abort")
        self._pending.append(out)
        return True

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished() or bool(self._pending)

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        results, stopped = self.outputs.process(self.core.step())
        if stopped:
            self.core.finish_requests(stopped, "stop")
        outputs.extend(results)
        return outputs

    def run_to_completion(self) -> dict[str, RequestOutput]:
        """Step until idle; the final output of every request (by id)."""
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for o in self.step():
                if o.finished:
                    final[o.request_id] = o
        return final

    def warmup(self, prompt_len: int | None = None):
        """Pay one-time costs (kernel compiles, GEMM heuristics, allocator growth) with throwaway requests
        before real traffic; statistics are left as they were. See ``engine/warmup.py``."""
        from torchinferno.engine.warmup import warmup_engine

        return warmup_engine(self, prompt_len)

    # ------------------------------------------------------------------ introspection
    def cached_prefix_tokens(self, prompt_token_ids: list[int]) -> int:
        """How many leading tokens of a prompt are in this replica's prefix cache (no side effects)."""
        return self.core.cached_prefix_tokens(prompt_token_ids)

    def load(self) -> int:
        """Requests in flight (running + waiting): the router's load measure."""
        return self.core.load()

    def stats(self) -> EngineStats:
        return self.core.stats()

    def describe(self) -> str:
        return self.core.describe()
