"""A model-free engine with ``LLMEngine``'s request/step interface, for dispatch microbenchmarks.

``SyntheticEngine`` keeps the shape of continuous batching (admission up to ``max_num_seqs`` and
a prefill token budget, one token per running request per step, abort) but a step is a timed
wait instead of a forward: ``step_ms + per_seq_us * batch + prefill_per_token_us * new prompt
tokens``. Plugged into ``AsyncEngine`` and the real FastAPI app, what remains of a request's
latency beyond the synthetic step costs is Python dispatch, queue hand-off, SSE streaming and
admission — the overheads ``openai-microbench --backend synthetic`` isolates.

``spin=True`` burns CPU holding the GIL for the step (like CPU-side model code); the default
sleeps, releasing it (like waiting on a GPU kernel).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm_engine import EngineStats
from torchinferno.engine.outputs import RequestOutput
from torchinferno.errors import ConfigError, SamplingError

__all__ = ["SyntheticCost", "SyntheticEngine"]


@dataclass
class SyntheticCost:
    step_ms: float = 2.0  # fixed cost of one forward (kernel launches, sync)
    per_seq_us: float = 30.0  # added per sequence in the batch
    prefill_per_token_us: float = 5.0  # added per prompt token prefilled this step
    spin: bool = False

    def step_seconds(self, num_seqs: int, prefill_tokens: int) -> float:
        return (self.step_ms * 1e3 + self.per_seq_us * num_seqs + self.prefill_per_token_us * prefill_tokens) / 1e6


@dataclass
class _Seq:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    cached: int = 0


class SyntheticEngine:
    """Same public surface as ``LLMEngine`` as far as ``AsyncEngine`` and the server use it.

    Emits lowercase ASCII letters (byte-tokenizer ids 97..122) so text deltas are one char per
    token; never emits EOS, so every request runs to ``max_tokens``. Prompts seen before count
    as fully prefix-cached (no prefill cost): ``--prompt-mode self-consistency`` shows it.
    """

    vocab_size = 259

    def __init__(self, cost: SyntheticCost | None = None, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 max_model_len: int = 4096):
        self.cost = cost or SyntheticCost()
        self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len = max_num_seqs, max_num_batched_tokens, max_model_len
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._ids: set[str] = set()
        self._pending: list[RequestOutput] = []
        self._seen_prompts: set[tuple[int, ...]] = set()
        self.eos_token_ids = frozenset({257})
        self.num_forward_calls = self._max_seqs = self._max_tokens = 0
        self._computed = self._generated = self._finished = self._aborted = 0
        self._prefix_q = self._prefix_h = 0
        self.phase_seconds = {"schedule": 0.0, "execute": 0.0, "emit": 0.0}

    # ---- requests ---------------------------------------------------------------------------
    def validate_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        params.validate()
        if params.n != 1:
            raise SamplingError("n > 1 is not supported by the engine; submit n requests")
        if not prompt_token_ids:
            raise ConfigError("empty prompt: at least one token is required")
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise ConfigError(f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                              f"the context length {self.max_model_len}")
        if request_id in self._ids:
            raise ConfigError(f"request id {request_id!r} is already in use")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        self.validate_request(request_id, prompt_token_ids, params)
        self._ids.add(request_id)
        self.waiting.append(_Seq(request_id, list(prompt_token_ids), params))

    def abort_request(self, request_id: str) -> bool:
        for coll in (self.running, self.waiting):
            for s in list(coll):
                if s.request_id == request_id:
                    coll.remove(s)
                    self._ids.discard(request_id)
                    self._aborted += 1
                    self._pending.append(self._output(s, [], finished=True, reason="abort"))
                    return True
        return False

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._pending)

    # ---- stepping ---------------------------------------------------------------------------
    def _output(self, s: _Seq, new: list[int], finished: bool, reason: str | None) -> RequestOutput:
        delta = "".join(chr(t) for t in new)
        return RequestOutput(request_id=s.request_id, new_token_ids=new, text_delta=delta,
                             text="".join(chr(t) for t in s.tokens), token_ids=list(s.tokens), finished=finished,
                             finish_reason=reason, prompt_tokens=len(s.prompt), completion_tokens=len(s.tokens),
                             num_cached_tokens=s.cached, prompt_token_ids=s.prompt)

    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        outputs, self._pending = self._pending, []
        budget = self.max_num_batched_tokens - len(self.running)
        prefill = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            s = self.waiting[0]
            key = tuple(s.prompt)
            need = 0 if key in self._seen_prompts else len(s.prompt)
            if need > budget and self.running:
                break
            self.waiting.popleft()
            self._prefix_q += len(s.prompt)
            if need == 0:
                s.cached = len(s.prompt)
                self._prefix_h += len(s.prompt)
            self._seen_prompts.add(key)
            budget -= need
            prefill += need
            self.running.append(s)
        t1 = time.perf_counter()
        if self.running:
            wait = self.cost.step_seconds(len(self.running), prefill)
            if self.cost.spin:
                end = time.perf_counter() + wait
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(wait)
            self.num_forward_calls += 1
            self._max_seqs = max(self._max_seqs, len(self.running))
            self._max_tokens = max(self._max_tokens, len(self.running) + prefill)
            self._computed += len(self.running) + prefill
        t2 = time.perf_counter()
        still = []
        for s in self.running:
            tok = 97 + (len(s.tokens) * 7 + len(s.request_id)) % 26
            s.tokens.append(tok)
            self._generated += 1
            done = len(s.tokens) >= s.params.max_tokens
            outputs.append(self._output(s, [tok], done, "length" if done else None))
            if done:
                self._ids.discard(s.request_id)
                self._finished += 1
            else:
                still.append(s)
        self.running = still
        t3 = time.perf_counter()
        ph = self.phase_seconds
        ph["schedule"] += t1 - t0
        ph["execute"] += t2 - t1
        ph["emit"] += t3 - t2
        return outputs

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.running), num_waiting=len(self.waiting), kv_usage=0.0, num_blocks=0, block_size=16,
            num_free_blocks=0, num_cached_blocks=0, prefix_queries=self._prefix_q, prefix_hits=self._prefix_h,
            num_preemptions=0, num_forward_calls=self.num_forward_calls, num_steps=self.num_forward_calls,
            max_batch_seqs=self._max_seqs, max_batch_tokens=self._max_tokens, num_computed_tokens=self._computed,
            num_generated_tokens=self._generated, num_finished=self._finished, num_aborted=self._aborted)
