"""``DataParallelLLM``: N engine-core processes behind one API server and one router (``serve --data-parallel-size``).

Each replica is a full ``AsyncLLM`` (its own ``EngineCoreProcess``: model, scheduler, KV pool; tensor-parallel
itself when ``--tensor-parallel-size`` asks). This object has the same interface as ``AsyncLLM`` (``generate``,
``abort``, ``abort_all``, ``stats``, ``is_running``, ``num_in_flight``, ``describe``, ``shutdown``, ``on_dead``), so
the server's routes do not know there are several.

Routing: ``generate`` asks the ``RoutingPolicy`` (``engine.route_policy``) for a replica, given each replica's load
(requests this process has in flight there: exact and current, unlike the core's last-step snapshot) and KV usage
(the core's last snapshot); the request stays on that replica to the end (``owner``), so aborts go to the core that
holds it. When it finishes, the policy learns the whole sequence (prompt + generated: cached there now).

Faults: the replicas are one serving unit: when any core dies, ``on_dead`` is called once and the server exits 1
(as with one core): the supervisor restarts all of them. The remote ``router`` command is the one that keeps
serving around a dead worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, fields

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.core import EngineStats, validate_request
from torchinferno.engine.outputs import RequestOutput
from torchinferno.engine.route_policy import ReplicaState, RoutingPolicy, make_policy
from torchinferno.errors import ConfigError, EngineDeadError

__all__ = ["DataParallelLLM", "replica_specs", "sum_stats"]


def sum_stats(stats: list[EngineStats]) -> EngineStats:
    """Counters and sizes added up; ``kv_usage`` the used-block-weighted mean; maxima kept as maxima."""
    if len(stats) == 1:
        return stats[0]
    vals = [sum(col) for col in zip(*(astuple(s) for s in stats))]
    d = dict(zip([f.name for f in fields(EngineStats)], vals))
    blocks = sum(s.num_blocks for s in stats)
    d["kv_usage"] = sum(s.kv_usage * s.num_blocks for s in stats) / blocks if blocks else 0.0
    d["block_size"] = stats[0].block_size
    d["max_batch_seqs"] = max(s.max_batch_seqs for s in stats)
    d["max_batch_tokens"] = max(s.max_batch_tokens for s in stats)
    return EngineStats(**d)


def replica_specs(model, engine_config, size: int) -> list:
    """One ``ModelSpec`` per replica: on ``--device cuda`` with single-device replicas and at least ``size`` GPUs,
    replica i gets ``cuda:i``; otherwise every replica uses the given device (replicas share it; tensor-parallel
    replicas all use ``cuda:0..TP-1``: ranks pick ``cuda:rank``)."""
    from dataclasses import replace

    if model.device != "cuda" or engine_config.tensor_parallel_size * engine_config.pipeline_parallel_size > 1:
        return [model] * size
    import torch

    if torch.cuda.device_count() < size:
        return [model] * size
    return [replace(model, device=f"cuda:{i}") for i in range(size)]


class DataParallelLLM:
    """N ``AsyncLLM`` replicas and a router (module docstring). ``replicas`` are built by the caller (tests may pass
    stand-ins); ``from_spec`` starts N engine-core processes in parallel."""

    def __init__(self, replicas: list, policy: RoutingPolicy | str = "round-robin"):
        if not replicas:
            raise ConfigError("--data-parallel-size must be >= 1")
        self.replicas = replicas
        self.policy = make_policy(policy, len(replicas)) if isinstance(policy, str) else policy
        first = replicas[0]
        self.info, self.max_model_len, self.limits = first.info, first.max_model_len, first.limits
        self.tokenizer, self.outputs = first.tokenizer, first.outputs
        self.owner: dict[str, int] = {}
        self.in_flight = [0] * len(replicas)
        self._on_dead: Callable[[str], None] | None = None
        self._dead_reported = False

    @classmethod
    def from_spec(cls, model, engine_config, tokenizer, size: int, policy: str, warmup: bool | None = None,
                  step_log: str | None = None, policy_options: dict | None = None) -> DataParallelLLM:
        """Start ``size`` engine-core processes at once (each builds its model in its own process)."""
        from torchinferno.engine.async_llm import AsyncLLM

        if size < 1:
            raise ConfigError(f"--data-parallel-size must be >= 1 (got {size})")
        logs = [None if step_log is None else (step_log if size == 1 else f"{step_log}.dp{i}") for i in range(size)]
        specs = replica_specs(model, engine_config, size)
        with ThreadPoolExecutor(size) as pool:
            futs = [pool.submit(AsyncLLM, specs[i], engine_config, tokenizer, warmup, step_log=logs[i])
                    for i in range(size)]
            built, err = [], None
            for f in futs:
                try:
                    built.append(f.result())
                except BaseException as e:  # noqa: BLE001  (stop the ones that did start, report the first failure)
                    err = err or e
        if err is not None:
            for r in built:
                r.shutdown(5)
            raise err
        opts = dict(policy_options or {})
        if policy.replace("_", "-") == "cache-aware":
            opts.setdefault("min_match_tokens", built[0].info.block_size)
            opts.setdefault("max_tree_tokens", built[0].info.num_blocks * built[0].info.block_size)
        return cls(built, make_policy(policy, size, **opts))

    # ------------------------------------------------------------------ state
    @property
    def on_dead(self):
        return self._on_dead

    @on_dead.setter
    def on_dead(self, fn: Callable[[str], None] | None) -> None:
        self._on_dead = fn
        for i, r in enumerate(self.replicas):
            r.on_dead = None if fn is None else (lambda reason, i=i: self._replica_died(i, reason))

    def _replica_died(self, i: int, reason: str) -> None:
        self.policy.replica_died(i)
        if not self._dead_reported and self._on_dead is not None:
            self._dead_reported = True
            self._on_dead(f"data-parallel replica {i}: {reason}")

    @property
    def is_running(self) -> bool:
        return all(r.is_running for r in self.replicas)

    @property
    def error(self) -> str | None:
        return next((f"replica {i}: {r.error}" for i, r in enumerate(self.replicas) if r.error), None)

    def states(self) -> list[ReplicaState]:
        return [ReplicaState(self.in_flight[i], r.stats().kv_usage, r.is_running) for i, r in enumerate(self.replicas)]

    def stats(self) -> EngineStats:
        return sum_stats([r.stats() for r in self.replicas])

    def replica_stats(self) -> list[EngineStats]:
        return [r.stats() for r in self.replicas]

    def num_in_flight(self) -> int:
        return sum(r.num_in_flight() for r in self.replicas)

    def describe(self) -> str:
        return (f"{len(self.replicas)} data-parallel replicas, router {self.policy.name}: "
                + "; ".join(r.describe() for r in self.replicas))

    # ------------------------------------------------------------------ requests
    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams | None = None) -> AsyncIterator[RequestOutput]:
        """As ``AsyncLLM.generate``, on the replica the policy picks."""
        if not self.is_running:
            raise EngineDeadError(f"the engine is not running{': ' + self.error if self.error else ''}")
        if request_id in self.owner:
            raise ConfigError(f"request id {request_id!r} is already in use")
        for r in self.replicas:  # every core's death watch runs in this loop, not only the routed one's
            start = getattr(r, "_start", None)
            if start is not None:
                start()
        prompt = [int(t) for t in prompt_token_ids]
        validate_request(self.limits, prompt, params or SamplingParams())  # before routing: a refusal teaches no tree
        i = self.policy.route(prompt, self.states()).replica
        self.owner[request_id] = i
        self.in_flight[i] += 1
        generated: list[int] = []
        done = False
        try:
            async for out in self.replicas[i].generate(request_id, prompt, params):
                generated = out.token_ids
                done = out.finished
                yield out
        finally:
            self.in_flight[i] -= 1
            self.owner.pop(request_id, None)
            if done:
                self.policy.finished(i, prompt + generated)

    async def abort(self, request_id: str) -> None:
        i = self.owner.get(request_id)
        if i is not None:
            await self.replicas[i].abort(request_id)

    async def abort_all(self) -> None:
        for r in self.replicas:
            await r.abort_all()

    def shutdown(self, timeout_s: float = 10.0) -> int | None:
        """Stop every core; returns the first non-zero exit status (else 0)."""
        codes = [r.shutdown(timeout_s) for r in self.replicas]
        return next((c for c in codes if c), codes[0])
