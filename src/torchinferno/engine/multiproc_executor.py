"""``MultiprocExecutor``: tensor-parallel workers, one ``torch.distributed`` rank per spawned process.

The engine core drives it through the ``Executor`` interface like the in-process one: it spawns ``N``
worker processes (loopback rendezvous on a free port; gloo on CPU, NCCL on CUDA with device ``cuda:rank``),
each builds its rank of the model (``parallel.load.build_rank_model``: only its shards are read), its KV
cache and runner (an ordinary ``Worker``), then runs every ``SchedulerOutput`` it is sent, in order. All
ranks sample the same tokens (the logits are all-gathered; seeded generators match); rank 0's tokens are
returned. Messages are pickled bytes over one pipe per worker.

``collective_rpc(fn, *args)`` runs ``fn(worker, rank, *args)`` on every rank (an importable function), in order
with the steps, and returns each rank's result: how a role of a prefill/decode pair drives the KV transport that
lives in each worker (``disagg.sharding``).

Invariants: steps reach every rank in the engine's order and their results are taken in that order;
the scheduler's block count is the smallest any rank allocated (every rank can hold every block table);
a worker that dies or fails is noticed while waiting (poll with a deadline, liveness check) and raises
``WorkerDiedError`` (the engine core then dies and the server exits non-zero); ``shutdown`` (also at
interpreter exit) ends every worker process.
"""

from __future__ import annotations

import pickle
import weakref
from collections import deque

import torch

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.executor import Executor
from torchinferno.engine.outputs import ModelRunnerOutput, SchedulerOutput
from torchinferno.errors import TorchInfernoError

__all__ = ["MultiprocExecutor", "WorkerDiedError"]

STARTUP_TIMEOUT_S = 600.0


class WorkerDiedError(TorchInfernoError):
    """A tensor-parallel worker process exited or raised."""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def worker_main(rank: int, world: int, port: int, backend: str, spec, config: EngineConfig, conn,
                mode: str = "tensor") -> None:
    """Process entry point of one rank: build, report geometry, then run steps until told to stop."""
    from torchinferno.engine.executor import Worker
    from torchinferno.env import apply_platform_defaults
    from torchinferno.parallel.load import build_rank_model
    from torchinferno.parallel.spawn import init_rank

    apply_platform_defaults()
    try:
        comm = init_rank(rank, world, port, backend, mode=mode)
        model = build_rank_model(spec, comm)
        worker = Worker(model, config)
        info = {"num_blocks": worker.kv_cache.num_blocks, "block_size": worker.kv_cache.block_size,
                "num_sliding_blocks": worker.kv_cache.num_sliding_blocks,
                "sliding_window": worker.kv_cache.spec.sliding_window,
                "prefill_graph_tokens": worker.runner.prefill_graph_tokens,
                "piecewise_graph_tokens": worker.runner.piecewise_graph_tokens,
                "mixed_graph_mode": worker.runner.mixed_graph_mode,
                "max_model_len": worker.max_model_len, "config": worker.config,
                "model_config": getattr(model, "full_config", model.config), "describe": _describe(worker)}
        conn.send_bytes(pickle.dumps(("ready", info)))
    except BaseException as e:  # noqa: BLE001  (report why in one line, then exit non-zero)
        conn.send_bytes(pickle.dumps(("error", _one_line(e))))
        raise SystemExit(1) from None
    while True:
        try:
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the engine side is gone: nothing more to run
            break
        if kind == "stop":
            break
        if kind == "rpc":
            fn, args = payload
            try:
                res = fn(worker, rank, *args)
            except BaseException as e:  # noqa: BLE001  (reported to the engine, then exit)
                conn.send_bytes(pickle.dumps(("error", _one_line(e))))
                raise SystemExit(1) from None
            conn.send_bytes(pickle.dumps(("ok", res)))
            continue
        try:
            out = worker.runner.execute_async(payload).result()
        except BaseException as e:  # noqa: BLE001  (reported to the engine, then exit)
            conn.send_bytes(pickle.dumps(("error", _one_line(e))))
            raise SystemExit(1) from None
        conn.send_bytes(pickle.dumps(("ok", (out, worker.runner.num_forward_calls) if rank == 0 else None)))
    import torch.distributed as dist

    dist.destroy_process_group()


def _describe(worker) -> str:
    kv = worker.kv_cache
    sliding = "" if kv.num_sliding_blocks is None else f" + {kv.num_sliding_blocks} sliding-window blocks"
    return (f"{kv.num_blocks}{sliding} blocks x {kv.block_size} tokens per rank ({kv.nbytes / 2**20:.1f} MiB, {kv.dtype}; "
            f"{worker.kv_plan.reason}), max_model_len={worker.max_model_len}, device={worker.device}, "
            f"max_num_seqs={worker.config.max_num_seqs}, max_num_batched_tokens={worker.config.max_num_batched_tokens}")


class _Handle:
    """The result of one step in flight: rank 0's tokens, taken in step order."""

    def __init__(self, executor: MultiprocExecutor):
        self._ex, self._out = executor, None

    def result(self) -> ModelRunnerOutput:
        while self._out is None:
            self._ex._collect_next()
        return self._out


def _shutdown_procs(procs, conns) -> None:
    for c in conns:
        try:
            c.send_bytes(pickle.dumps(("stop", None)))
        except (OSError, ValueError):
            pass
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


class MultiprocExecutor(Executor):
    """Runs steps on ``config.tensor_parallel_size`` worker processes (module docstring).

    ``spec``: the ``engine.assembly.ModelSpec`` every rank builds its shard of."""

    def __init__(self, spec, config: EngineConfig, world: int | None = None, timeout_s: float = STARTUP_TIMEOUT_S):
        import torch.multiprocessing as mp

        from torchinferno.parallel.checks import check_spec, parallel_world
        from torchinferno.ports import free_port, once_more_if_port_taken

        ranks, self.mode = parallel_world(config)
        world = world or ranks
        check_spec(spec, world, self.mode)  # one line before any process starts: devices, heads / experts divisible
        self.world = world
        self.device = torch.device(spec.device.split(",")[0])  # a comma list: rank r on its r-th entry
        self.backend = "nccl" if spec.device.startswith("cuda") else "gloo"
        self.step_timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self._pending: deque[_Handle] = deque()
        self._forward_calls = 0
        def start() -> list[dict]:
            self._procs, self._conns = [], []
            port = free_port()
            for rank in range(world):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=worker_main, args=(rank, world, port, self.backend, spec, config, child,
                                                          self.mode), name=f"torchinferno-tp-worker-{rank}", daemon=False)
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            self._finalizer = weakref.finalize(self, _shutdown_procs, self._procs, self._conns)
            try:
                return [self._recv(rank, timeout_s, "starting") for rank in range(world)]
            except BaseException:
                self.shutdown()
                raise

        # the rendezvous port can be taken between free_port() and rank 0's bind
        infos = once_more_if_port_taken(start)
        self.config = infos[0]["config"]
        self.model_config = infos[0]["model_config"]
        self.num_blocks = min(i["num_blocks"] for i in infos)
        self.sliding_window = infos[0]["sliding_window"]
        self.prefill_graph_tokens = min(i["prefill_graph_tokens"] for i in infos)  # a step is a graph on every rank
        self.piecewise_graph_tokens = min(i["piecewise_graph_tokens"] for i in infos)
        modes = {i["mixed_graph_mode"] for i in infos}  # ranks that disagree: report it, the cost differs
        self.mixed_graph_mode = modes.pop() if len(modes) == 1 else "mixed"
        self.num_sliding_blocks = None if infos[0]["num_sliding_blocks"] is None else min(
            i["num_sliding_blocks"] for i in infos)
        self.block_size = infos[0]["block_size"]
        self.max_model_len = min(i["max_model_len"] for i in infos)
        self._describe = infos[0]["describe"]

    # ------------------------------------------------------------------ messages
    def _recv(self, rank: int, timeout_s: float, doing: str):
        conn, proc = self._conns[rank], self._procs[rank]
        waited = 0.0
        while not conn.poll(0.5):
            waited += 0.5
            if not proc.is_alive():
                raise WorkerDiedError(f"tensor-parallel worker rank {rank} exited (code {proc.exitcode}) while {doing}")
            if waited >= timeout_s:
                raise WorkerDiedError(f"tensor-parallel worker rank {rank} did not answer within {timeout_s:.0f} s "
                                      f"while {doing}")
        try:
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            raise WorkerDiedError(f"tensor-parallel worker rank {rank} closed its pipe while {doing}") from None
        if kind == "error":
            raise WorkerDiedError(f"tensor-parallel worker rank {rank} failed while {doing}: {payload}")
        return payload

    def _collect_next(self) -> None:
        handle = self._pending.popleft()
        try:
            outs = [self._recv(rank, self.step_timeout_s, "running a step") for rank in range(self.world)]
        except WorkerDiedError as e:  # a rank's collective fails when another rank dies: name the dead one too
            for p in self._procs:
                p.join(1.0)
            dead = [f"rank {r} exit code {p.exitcode}" for r, p in enumerate(self._procs) if p.exitcode is not None]
            raise WorkerDiedError(f"{e} [{'; '.join(dead) or 'no worker exited'}]") from None
        handle._out, self._forward_calls = outs[0]

    def _send_all(self, msg: bytes) -> None:
        """One message to every rank's pipe; a closed pipe names its rank and exit code."""
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(msg)
            except (OSError, ValueError):
                raise WorkerDiedError(f"tensor-parallel worker rank {rank} is gone (exit code "
                                      f"{self._procs[rank].exitcode})") from None

    # ------------------------------------------------------------------ Executor interface
    def execute_async(self, sched: SchedulerOutput) -> _Handle:
        self._send_all(pickle.dumps(("step", sched)))
        handle = _Handle(self)
        self._pending.append(handle)
        return handle

    def collective_rpc(self, fn, *args, timeout_s: float | None = None) -> list:
        """``[fn(worker, rank, *args) for each rank]``, run in the workers after every step already sent (their
        results are collected first, so each pipe's next answer is this call's)."""
        while self._pending:
            self._collect_next()
        self._send_all(pickle.dumps(("rpc", (fn, args))))
        name = getattr(fn, "__name__", "a call")
        return [self._recv(rank, timeout_s or self.step_timeout_s, f"running {name}") for rank in range(self.world)]

    @property
    def num_forward_calls(self) -> int:
        return self._forward_calls

    @property
    def num_graph_steps(self) -> int:
        return 0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def describe(self) -> str:
        return f"{self._describe}, {self.mode}-parallel {self.world} ranks ({self.backend})"

    def shutdown(self) -> None:
        self._finalizer()
