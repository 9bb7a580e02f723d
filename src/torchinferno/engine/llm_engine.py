"""``LLMEngine``: add requests, call ``step()``, get per-request outputs (continuous batching).

One ``step()`` = scheduler.schedule() -> runner.execute() -> scheduler.update_from_output() ->
text processing. Requests join and leave at every step. Not thread-safe: one thread drives it
(``AsyncEngine`` runs it in a background thread and feeds it through a queue).

With ``EngineConfig.async_scheduling`` one step is kept in flight: ``step()`` schedules and
launches step k (``runner.execute_async``; inputs that step k-1 sampled are filled on the device),
then waits for step k-1's sampled tokens and applies them (update + text) while the device runs
step k, and returns step k-1's outputs. Invariants: at most one launched step is unapplied
between ``step()`` calls; steps are applied in launch order; ``has_unfinished()`` counts the
in-flight step; when nothing is left to schedule, ``step()`` just applies it. A request aborted
or stopped (stop string) while its next step is in flight is finished at once (blocks freed;
device work is stream-ordered, so a later step reusing them runs after the in-flight one) and
that step's result for it is dropped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from torch import nn

from torchinferno.cache.block_pool import BlockPool, hash_token_blocks
from torchinferno.cache.kv_cache import allocate_kv_cache
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import DEFAULT_KV_CACHE_MEMORY, EngineConfig
from torchinferno.engine.graph_runner import make_model_runner
from torchinferno.engine.output_processor import RequestTextState
from torchinferno.engine.outputs import ModelRunnerOutput, RequestOutput, SchedulerOutput
from torchinferno.engine.request import Request, RequestStatus
from torchinferno.engine.scheduler import Scheduler
from torchinferno.engine.step_handle import StepHandle
from torchinferno.errors import ConfigError, SamplingError
from torchinferno.kernels.kv_dtype import is_fp8

__all__ = ["LLMEngine", "EngineStats"]


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks referenced by live requests
    num_blocks: int
    block_size: int
    num_free_blocks: int
    num_cached_blocks: int
    prefix_queries: int  # tokens looked up in the prefix cache
    prefix_hits: int  # tokens found
    num_preemptions: int
    num_forward_calls: int
    num_steps: int
    max_batch_seqs: int  # largest number of requests in one forward
    max_batch_tokens: int  # largest number of tokens in one forward
    num_computed_tokens: int  # tokens run through the model (prefill, recompute and decode)
    num_generated_tokens: int
    num_finished: int
    num_aborted: int
    num_graph_steps: int = 0  # decode steps replayed from CUDA graphs

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "prefix_hit_rate": self.prefix_hit_rate}


def _model_max_len(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "max_position_embeddings", None)


class LLMEngine:
    """A single-replica serving engine over ``model`` (any family: built via the protocol)."""

    def __init__(self, model: nn.Module, tokenizer=None, config: EngineConfig | None = None, **overrides):
        if config is None:
            config = EngineConfig(**overrides)
        elif overrides:
            raise ConfigError("pass either config or keyword overrides, not both")
        config = replace(config)  # private copy: derived limits below are written into it
        family = getattr(model, "family", None)
        if family is None:
            raise ConfigError("model has no .family (build it through a ModelFamily or load_model_auto)")
        if isinstance(tokenizer, str):
            from torchinferno.text.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        param = next(model.parameters())
        self.device = param.device
        dtype = config.kv_cache_dtype or param.dtype
        spec = family.kv_spec(model.config)
        if is_fp8(dtype) and any(layer.kind != "mha" for layer in spec.layers):
            raise ConfigError(f"kv_cache_dtype {dtype} supports k/v (GQA) caches only; family {family.name!r} stores "
                              f"{sorted({layer.kind for layer in spec.layers})} (use kv_cache_dtype auto)")

        model_len = _model_max_len(model)
        if config.max_model_len is not None and model_len is not None and config.max_model_len > model_len:
            raise ConfigError(f"max_model_len={config.max_model_len} exceeds the model's context length {model_len}")
        want_len = config.max_model_len or model_len or 2048
        bs = config.block_size
        num_blocks, memory = config.num_gpu_blocks, config.kv_cache_memory
        if num_blocks is None and memory is None:
            per_block = spec.bytes_per_token(dtype) * bs
            num_blocks = max(1, min(-(-want_len // bs) * config.max_num_seqs, DEFAULT_KV_CACHE_MEMORY // per_block))
        self.kv_cache = allocate_kv_cache(spec, bs, dtype, self.device, num_blocks=num_blocks, memory_bytes=memory)
        capacity = self.kv_cache.num_tokens
        if config.max_model_len is not None and config.max_model_len > capacity:
            raise ConfigError(f"max_model_len={config.max_model_len} does not fit the KV cache "
                              f"({self.kv_cache.num_blocks} blocks x {bs} = {capacity} tokens); raise kv_cache_memory")
        self.max_model_len = min(want_len, capacity)
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < self.max_model_len:
            config.max_num_batched_tokens = self.max_model_len  # a whole prompt must fit one step

        self.pool = BlockPool(self.kv_cache.num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.pool, self.max_model_len)
        self.runner = make_model_runner(model, self.kv_cache, config, self.max_model_len)
        self.vocab_size = getattr(model.config, "vocab_size", None)
        eos = set(getattr(model.config, "eos_token_ids", []) or [])
        if tokenizer is not None:
            eos |= set(tokenizer.eos_token_ids)
        self.eos_token_ids = frozenset(eos)
        self._states: dict[str, RequestTextState] = {}
        self._pending: list[RequestOutput] = []  # abort outputs reported by the next step
        self._inflight: tuple[SchedulerOutput, StepHandle] | None = None  # async scheduling: launched, unapplied
        self._steps = 0
        self._max_seqs = self._max_tokens = 0
        self._computed_tokens = self._gen_tokens = 0
        self._finished = self._aborted = 0

    # ------------------------------------------------------------------ requests
    def validate_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise a ``TorchInfernoError`` for anything the engine cannot serve (boundary check)."""
        params.validate()
        if params.n != 1:
            raise SamplingError("n > 1 is not supported by the engine; submit n requests")
        if params.logprobs is not None and not (0 <= params.logprobs <= self.config.max_logprobs):
            raise SamplingError(f"logprobs must be in [0, {self.config.max_logprobs}], got {params.logprobs}")
        if not prompt_token_ids:
            raise ConfigError("empty prompt: at least one token is required")
        if self.vocab_size is not None and any(not 0 <= int(t) < self.vocab_size for t in prompt_token_ids):
            raise ConfigError(f"prompt token ids must be in [0, {self.vocab_size})")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ConfigError(f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                              f"the context length {self.max_model_len}")
        if request_id in self._states:
            raise ConfigError(f"request id {request_id!r} is already in use")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_token_ids]
        self.validate_request(request_id, prompt, params)
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        req = Request(request_id, prompt, params, frozenset(stop))
        if arrival_time is not None:
            req.arrival_time = arrival_time
        self.scheduler.add_request(req)
        self._states[request_id] = RequestTextState(request_id, prompt, params, self.tokenizer)

    def abort_request(self, request_id: str) -> bool:
        """Abort a live request and free its blocks now; the next ``step()`` reports it finished."""
        state = self._states.pop(request_id, None)
        if state is None:
            return False
        self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        state.abort()
        self._aborted += 1
        self._pending.append(state.make_output([], ""))
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending) or self._inflight is not None

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        if self.config.async_scheduling:
            return self._step_async(outputs)
        if not self.scheduler.has_unfinished():
            return outputs
        sched = self._schedule()
        self._apply(sched, self.runner.execute(sched), outputs)
        return outputs

    def _step_async(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Launch step k, then apply step k-1 while the device runs step k (module docstring)."""
        launched = None
        if self.scheduler.has_unfinished():
            sched = self._schedule()
            handle = self.runner.execute_async(sched)  # every SchedulerOutput reaches the runner, in order
            if sched.scheduled:
                launched = (sched, handle)
        prev, self._inflight = self._inflight, launched
        if prev is not None:
            self._apply(prev[0], prev[1].result(), outputs)
        return outputs

    def _schedule(self) -> SchedulerOutput:
        sched = self.scheduler.schedule()
        if not sched.scheduled and not self.scheduler.running and not sched.preempted_ids:
            # Nothing in flight can free blocks either: its requests are running, finished or preempted.
            raise RuntimeError("scheduler made no progress: the KV pool cannot hold the next waiting request")
        self._steps += 1
        if sched.scheduled:
            num_tokens = sched.total_num_tokens
            self._max_seqs = max(self._max_seqs, sched.num_seqs)
            self._max_tokens = max(self._max_tokens, num_tokens)
            self._computed_tokens += num_tokens
        return sched

    def _apply(self, sched: SchedulerOutput, runner_out: ModelRunnerOutput, outputs: list[RequestOutput]) -> None:
        """Apply one step's sampled tokens: scheduler state, then text and stop strings."""
        for res in self.scheduler.update_from_output(sched, runner_out):
            req = res.request
            state = self._states[req.request_id]
            lps = None
            if req.sampling_params.logprobs is not None:
                lps = [runner_out.logprobs[req.request_id]]
            delta = ""
            for tok in res.new_token_ids:
                delta += state.add_token(tok, req)
            self._gen_tokens += len(res.new_token_ids)
            reason = state.finish_reason
            if reason is not None and not res.finished:
                # A stop string ended it; the scheduler frees the blocks.
                self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)
            outputs.append(state.make_output(res.new_token_ids, delta, req.num_cached_tokens, lps))
            if reason is not None:
                del self._states[req.request_id]
                self._finished += 1

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
        hashes = hash_token_blocks(prompt_token_ids, self.pool.block_size)
        return len(self.pool.lookup(hashes)) * self.pool.block_size

    def load(self) -> int:
        """Requests in flight (running + waiting): the router's load measure."""
        return self.scheduler.num_running + self.scheduler.num_waiting

    def stats(self) -> EngineStats:
        p = self.pool
        return EngineStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting, kv_usage=p.usage,
            num_blocks=p.num_blocks, block_size=p.block_size, num_free_blocks=p.num_free,
            num_cached_blocks=p.num_cached_blocks, prefix_queries=p.prefix_queries, prefix_hits=p.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions, num_forward_calls=self.runner.num_forward_calls,
            num_steps=self._steps, max_batch_seqs=self._max_seqs, max_batch_tokens=self._max_tokens,
            num_computed_tokens=self._computed_tokens, num_generated_tokens=self._gen_tokens,
            num_finished=self._finished, num_aborted=self._aborted, num_graph_steps=self.runner.num_graph_steps,
        )

    def describe(self) -> str:
        kv = self.kv_cache
        return (f"{kv.num_blocks} blocks x {kv.block_size} tokens ({kv.nbytes / 2**20:.1f} MiB, {kv.dtype}), "
                f"max_model_len={self.max_model_len}, device={self.device}, "
                f"runner={'cuda-graphs' if self.runner.uses_cuda_graphs else 'eager'}"
                f"{', async scheduling' if self.config.async_scheduling else ''}")
