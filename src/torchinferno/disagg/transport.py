"""The KV transport of a prefill/decode pair: a dedicated two-rank ``torch.distributed`` group and one thread.

Rank 0 is the prefill role, rank 1 the decode role. The group is built from its own ``TCPStore`` (rank 0 hosts it on
a port the API process picked), never the default group, so a role may also run its own tensor-parallel world.
Backend: ``gloo`` (CPU tensors; a CUDA cache is staged through host memory), ``nccl`` (device buffers; the two
roles on different GPUs: NCCL refuses two ranks of one communicator on one device) or ``cuda-ipc`` (both roles on
one GPU: the payload moves device to device through a staging buffer the prefill side allocates once and the decode
side maps with CUDA IPC, ``torch.multiprocessing``'s sharing of CUDA tensors; headers and per-chunk
acknowledgements go over the gloo group; a payload larger than the buffer moves in chunks, each acknowledged before
the buffer is reused).

Each side has one transfer thread that connects (the rendezvous blocks only that thread; the stores a side hosts
are bound before it starts, so a taken port fails the constructor) and then runs transfers in the order they were
queued, so the engine loop never waits on the wire. Protocol per transfer, sender ->
receiver: a header ``int64 [4] = (transfer_id, start, stop, nbytes)`` then, when ``nbytes > 0``, the payload
(``kv_io.pack_kv``). ``nbytes = -1``: the sender has no KV for that transfer (the receiver drops the request).
Both sides queue transfers in the same order (the decode side's ``ready`` order, relayed by the API process); a
header whose transfer id is not the expected one is a protocol error that breaks the transport.
Invariant: each queued transfer produces exactly one ``TransferDone`` (``ok`` or not), from ``poll()``; after a
failure (peer gone, timeout) the transport is broken and every later transfer fails at once.

Tensor-parallel roles (``disagg.sharding``): one such pair per TP rank, living in the TP worker processes; a
``KVPart`` says which cache tensors the pair moves (its rank's shards, plus the replicated tensors this rank
owns: each replicated tensor crosses on exactly one pair) and, on the decode side, the fan-out group over which
each decode rank broadcasts the replicated rows it received to the other decode ranks (same transfer order and
the same owner table on every rank, so the broadcasts line up). A pair that breaks on one decode rank leaves the
other decode ranks waiting in that transfer's broadcast until ``timeout_s``; then they break too (every later
transfer fails, as above).
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from dataclasses import dataclass

import torch

from torchinferno.disagg.kv_io import Which, pack_kv, payload_bytes, unpack_kv

__all__ = ["BACKENDS", "FanoutConfig", "KVPart", "KVTransport", "TransferDone", "TransportConfig", "pick_backend"]


BACKENDS = ("gloo", "nccl", "cuda-ipc")
STAGING_BYTES = 256 << 20  # cuda-ipc: the shared staging buffer (one chunk in flight)


def pick_backend(prefill_device: str, decode_device: str) -> str:
    """``nccl`` for two different CUDA devices, ``cuda-ipc`` for one CUDA device, else ``gloo`` (CPU)."""
    p, d = torch.device(prefill_device), torch.device(decode_device)
    if p.type == d.type == "cuda":
        return "nccl" if (p.index or 0) != (d.index or 0) else "cuda-ipc"
    return "gloo"


@dataclass(frozen=True)
class TransportConfig:
    rank: int  # 0 = prefill (sends, hosts the store), 1 = decode (receives)
    host: str
    port: int
    backend: str  # "gloo" | "nccl" | "cuda-ipc"
    timeout_s: float = 60.0
    # Timings are always measured: the transfer thread synchronizes its own stream after each phase anyway (the pack
    # must be done before the held blocks are released, the unpack before the request runs), never the engine's
    # stream. ``profile`` only asks the API process to log them and put them in the integrity record.
    profile: bool = False


@dataclass(frozen=True)
class FanoutConfig:
    """The decode role's own group over its TP ranks (rank 0 hosts its store): replicated rows are broadcast here."""

    rank: int
    world: int
    host: str
    port: int
    timeout_s: float = 60.0


@dataclass(frozen=True)
class KVPart:
    """What one tensor-parallel pair moves: ``moved`` over the pair; ``fanned[o]`` (decode side, ``fanout`` set): the
    replicated tensors pair ``o`` moves, which decode rank ``o`` then broadcasts to the other decode ranks (every
    rank holds the same table)."""

    moved: Which
    fanned: tuple[Which, ...] = ()
    fanout: FanoutConfig | None = None


@dataclass
class TransferDone:
    request_id: str
    transfer_id: int
    ok: bool
    nbytes: int = 0
    error: str | None = None
    pack_s: float = 0.0  # gather (sender) or scatter (receiver) time
    wire_s: float = 0.0  # header + payload send / receive


@dataclass
class _Job:
    request_id: str
    transfer_id: int
    block_ids: list[int]
    start: int
    stop: int
    missing: bool = False  # sender: no KV held for it (send a -1 header)
    sliding_block_ids: list[int] | None = None  # hybrid KV caches: the sliding group's blocks (kv_io)


def _tcp_store(host: str, port: int, world: int, timeout_s: float, server: bool):
    """A group's TCPStore: the one this process hosts (``server``: bound before returning, its clients join later)
    or a client of it (blocks until it reaches the host)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world, server, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


class KVTransport:
    """One side of the pair (module docstring). ``kv`` is this role's ``PagedKVCache`` (or its TP rank's, with
    ``part``: what this pair moves; default every tensor)."""

    def __init__(self, cfg: TransportConfig, kv, part: KVPart | None = None):
        self.cfg = cfg
        self.kv = kv
        self.moved = part.moved if part is not None else None
        self.fanned = part.fanned if part is not None else ()
        self.fanout = part.fanout if part is not None and any(part.fanned) else None
        self._fan_pg = None
        self.broken: str | None = None
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._done: queue.Queue[TransferDone] = queue.Queue()
        self._pending = 0
        self._pg = None
        self._store = None
        self._fan_store = None
        self._staging: torch.Tensor | None = None  # cuda-ipc: the shared buffer (owned by rank 0, mapped by rank 1)
        # the stores this side hosts bind now, so a port taken since it was picked fails the role's startup (the API
        # process then starts the pair on fresh ports); joining the groups waits for the peers on the thread
        if cfg.rank == 0:
            self._store = _tcp_store(cfg.host, cfg.port, 2, cfg.timeout_s, server=True)
        if self.fanout is not None and self.fanout.rank == 0:
            f = self.fanout
            self._fan_store = _tcp_store(f.host, f.port, f.world, f.timeout_s, server=True)
        self._thread = threading.Thread(target=self._run, name=f"kv-transport-{cfg.rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ engine-loop side
    def submit(self, request_id: str, transfer_id: int, block_ids: list[int], start: int, stop: int,
               missing: bool = False, sliding_block_ids: list[int] | None = None) -> None:
        """Queue one transfer (a send on rank 0, a receive into ``block_ids`` on rank 1); never blocks."""
        self._pending += 1
        self._jobs.put(_Job(request_id, transfer_id, list(block_ids), start, stop, missing,
                            None if sliding_block_ids is None else list(sliding_block_ids)))

    @property
    def pending(self) -> int:
        return self._pending

    def poll(self) -> list[TransferDone]:
        """Transfers finished since the last call (in order)."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        self._pending -= len(out)
        return out

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=2.0)

    # ------------------------------------------------------------------ transfer thread
    def _connect(self) -> None:
        import torch.distributed as dist

        cfg = self.cfg
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        if self._store is None:
            self._store = _tcp_store(cfg.host, cfg.port, 2, cfg.timeout_s, server=False)
        if cfg.backend == "nccl":
            self._pg = dist.ProcessGroupNCCL(self._store, cfg.rank, 2)
        else:
            self._pg = dist.ProcessGroupGloo(self._store, cfg.rank, 2, timeout)
        if cfg.backend == "cuda-ipc":
            self._share_staging()
        if self.fanout is not None:
            f = self.fanout
            t = datetime.timedelta(seconds=f.timeout_s)
            if self._fan_store is None:
                self._fan_store = _tcp_store(f.host, f.port, f.world, f.timeout_s, server=False)
            store = self._fan_store
            self._fan_pg = (dist.ProcessGroupNCCL(store, f.rank, f.world) if self.kv.device.type == "cuda"
                            else dist.ProcessGroupGloo(store, f.rank, f.world, t))

    def _share_staging(self) -> None:
        """Rank 0 allocates the staging buffer and publishes its CUDA IPC handle in the pair's own store (a local
        TCPStore between these two processes); rank 1 maps it. torch's CUDA tensor sharing keeps the allocation
        alive while the consumer holds it."""
        import pickle

        from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

        if self.cfg.rank == 0:
            self._staging = torch.empty(STAGING_BYTES, dtype=torch.uint8, device=self.kv.device)
            _, args = reduce_tensor(self._staging)
            self._store.set("kv_staging", pickle.dumps(args))
        else:
            self._staging = rebuild_cuda_tensor(*pickle.loads(self._store.get("kv_staging")))

    def _run(self) -> None:
        if self.kv.device.type == "cuda":
            torch.cuda.set_device(self.kv.device)  # this thread's current device: its stream and NCCL's
        try:
            self._connect()
        except Exception as e:  # noqa: BLE001 - reported per transfer
            self.broken = f"KV transport could not connect ({type(e).__name__}: {e})"
        stream = torch.cuda.Stream(self.kv.device) if self.kv.device.type == "cuda" else None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self.broken is not None:
                self._done.put(TransferDone(job.request_id, job.transfer_id, False, error=self.broken))
                continue
            try:
                if stream is not None:
                    with torch.cuda.stream(stream):
                        done = self._transfer(job, stream)
                else:
                    done = self._transfer(job, None)
            except Exception as e:  # noqa: BLE001 - the peer died, timed out or broke the protocol
                self.broken = f"KV transfer failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                done = TransferDone(job.request_id, job.transfer_id, False, error=self.broken)
            self._done.put(done)

    def _sync(self, stream) -> None:
        if stream is not None:
            stream.synchronize()

    def _wire_device(self) -> torch.device:
        return self.kv.device if self.cfg.backend == "nccl" else torch.device("cpu")

    def _payload_device(self) -> torch.device:
        return self.kv.device if self.cfg.backend in ("nccl", "cuda-ipc") else torch.device("cpu")

    def _send_payload(self, buf: torch.Tensor, stream) -> None:
        if self.cfg.backend != "cuda-ipc":
            self._pg.send([buf], 1, 0).wait()
            return
        ack = torch.empty(1, dtype=torch.long)
        for off in range(0, buf.numel(), STAGING_BYTES):
            n = min(STAGING_BYTES, buf.numel() - off)
            self._staging[:n].copy_(buf[off:off + n])
            self._sync(stream)  # the chunk is in the buffer before the peer is told
            self._pg.send([torch.tensor([off, n], dtype=torch.long)], 1, 1).wait()
            self._pg.recv([ack], 1, 2).wait()  # the peer copied it out: the buffer is free again

    def _recv_payload(self, buf: torch.Tensor, stream) -> None:
        if self.cfg.backend != "cuda-ipc":
            self._pg.recv([buf], 0, 0).wait()
            return
        hdr = torch.empty(2, dtype=torch.long)
        got = 0
        while got < buf.numel():
            self._pg.recv([hdr], 0, 1).wait()
            off, n = (int(x) for x in hdr.tolist())
            if off != got or n <= 0 or off + n > buf.numel():
                raise RuntimeError(f"KV chunk {off}+{n} out of order (expected offset {got} of {buf.numel()})")
            buf[off:off + n].copy_(self._staging[:n])
            self._sync(stream)
            self._pg.send([torch.tensor([off], dtype=torch.long)], 0, 2).wait()
            got += n

    def _transfer(self, job: _Job, stream) -> TransferDone:
        clock = time.perf_counter
        if self.cfg.rank == 0:
            t0 = clock()
            if job.missing:
                buf = None
                nbytes = -1
            else:
                buf = pack_kv(self.kv, job.block_ids, job.start, job.stop, self.moved,
                              job.sliding_block_ids).to(self._payload_device())
                self._sync(stream)
                nbytes = buf.numel()
            t1 = clock()
            header = torch.tensor([job.transfer_id, job.start, job.stop, nbytes], dtype=torch.long,
                                  device=self._wire_device())
            self._pg.send([header], 1, 0).wait()
            if nbytes > 0:
                self._send_payload(buf, stream)
            self._sync(stream)
            t2 = clock()
            if job.missing:
                return TransferDone(job.request_id, job.transfer_id, False, error="no KV held for the request")
            return TransferDone(job.request_id, job.transfer_id, True, nbytes, None, t1 - t0, t2 - t1)
        t0 = clock()
        header = torch.empty(4, dtype=torch.long, device=self._wire_device())
        self._pg.recv([header], 0, 0).wait()
        tid, start, stop, nbytes = (int(x) for x in header.tolist())
        if tid != job.transfer_id:
            raise RuntimeError(f"expected KV transfer {job.transfer_id}, got {tid}")
        if nbytes < 0:
            return TransferDone(job.request_id, job.transfer_id, False, error="the prefill role had no KV for it")
        want = payload_bytes(self.kv, job.start, job.stop, self.moved)
        if (start, stop) != (job.start, job.stop) or nbytes != want:
            raise RuntimeError(f"KV transfer {tid}: rows {start}..{stop} / {nbytes} bytes, expected "
                               f"{job.start}..{job.stop} / {want}")
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self._payload_device())
        if nbytes:
            self._recv_payload(buf, stream)
        self._sync(stream)
        t1 = clock()
        unpack_kv(self.kv, job.block_ids, start, stop, buf, self.moved, job.sliding_block_ids)
        self._sync(stream)
        t2 = clock()
        if self._fan_pg is not None:
            self._fan_out(job)
            self._sync(stream)
        return TransferDone(job.request_id, job.transfer_id, True, nbytes, None, t2 - t1, t1 - t0 + clock() - t2)

    def _fan_out(self, job: _Job) -> None:
        """Each decode rank broadcasts the replicated rows it owns and just received; the others store them."""
        dev = self.kv.device if self.kv.device.type == "cuda" else torch.device("cpu")
        for owner, which in enumerate(self.fanned):
            n = payload_bytes(self.kv, job.start, job.stop, which)
            if n == 0:
                continue
            if self.fanout.rank == owner:
                buf = pack_kv(self.kv, job.block_ids, job.start, job.stop, which, job.sliding_block_ids).to(dev)
            else:
                buf = torch.empty(n, dtype=torch.uint8, device=dev)
            self._fan_pg.broadcast(buf, owner).wait()
            if self.fanout.rank != owner:
                unpack_kv(self.kv, job.block_ids, job.start, job.stop, buf, which, job.sliding_block_ids)
