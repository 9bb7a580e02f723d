"""What a prefill/decode pair moved: cumulative KV-transfer totals, the Prometheus collectors of ``/metrics``, the
``--disaggregation-profile`` log lines and the ``--disaggregation-record`` JSONL integrity records.

One ``disaggregated_runtime_integrity`` record per completed request (its "stream group"): sequence number,
cumulative and per-request KV transfer counts/bytes/tokens, whether it waited for decode blocks, the role
topology and the transport; with ``profile``, pack / send / receive / unpack timings. Fed from the API process
only (``disagg.client``), so writing it never synchronizes a device.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from torchinferno.disagg.messages import KVReceived, KVSent

__all__ = ["KVTransferTotals", "TransferLedger"]


@dataclass
class KVTransferTotals:
    count: int = 0  # transfers received intact
    nbytes: int = 0  # their KV bytes
    failed: int = 0
    waited: int = 0  # handoffs that queued on the decode side for free blocks
    pack_s: float = 0.0
    send_s: float = 0.0
    recv_s: float = 0.0
    unpack_s: float = 0.0


@dataclass
class RequestTransfer:
    """One request's handoff, as the record reports it."""

    nbytes: int = 0
    tokens: int = 0
    seconds: float = 0.0  # pack + send on the prefill side
    waited_for_blocks: bool = False


class TransferLedger:
    def __init__(self, record_path: str | None, profile: bool):
        self.totals = KVTransferTotals()
        self.profile = profile
        self._record = open(record_path, "a", buffering=1) if record_path else None  # noqa: SIM115 - closed in close()
        self._sequence = 0
        self._metrics = None

    def bind_metrics(self, metrics) -> None:
        """Register the KV-transfer collectors in a ``server.metrics.ServerMetrics``' registry."""
        from prometheus_client import Counter, Histogram

        r, lbl = metrics.registry, ["model_name"]
        b = (2**10, 2**14, 2**17, 2**20, 2**23, 2**26, 2**29, 2**32)
        t = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
        self._metrics = (metrics.model,
                         Histogram("torchinferno_disagg_kv_transfer_bytes", "KV bytes moved per request (prefill -> decode)",
                                   lbl, buckets=b, registry=r),
                         Histogram("torchinferno_disagg_kv_transfer_seconds", "KV transfer time per request "
                                   "(pack + send on the prefill side)", lbl, buckets=t, registry=r),
                         Counter("torchinferno_disagg_kv_transfers", "KV transfers by outcome", lbl + ["outcome"],
                                 registry=r))

    def sent(self, msg: KVSent, req: RequestTransfer | None) -> None:
        t = self.totals
        if msg.ok:
            t.pack_s += msg.pack_s
            t.send_s += msg.wire_s
            if self._metrics is not None:
                self._metrics[2].labels(self._metrics[0]).observe(msg.pack_s + msg.wire_s)
        if req is not None:
            req.seconds = msg.pack_s + msg.wire_s
        if self.profile:
            print(f"disagg {msg.request_id}: prefill side pack {msg.pack_s * 1e3:.3f} ms, send {msg.wire_s * 1e3:.3f} ms, "
                  f"{msg.nbytes} bytes{'' if msg.ok else ' FAILED: ' + str(msg.error)}", file=sys.stderr, flush=True)

    def received(self, msg: KVReceived, req: RequestTransfer | None) -> None:
        t = self.totals
        if msg.ok:
            t.count += 1
            t.nbytes += msg.nbytes
            t.unpack_s += msg.unpack_s
            t.recv_s += msg.wire_s
        else:
            t.failed += 1
        t.waited += int(msg.waited_for_blocks)
        if req is not None:
            req.nbytes, req.tokens, req.waited_for_blocks = msg.nbytes, msg.num_tokens, msg.waited_for_blocks
        if self._metrics is not None:
            name, nbytes, _, count = self._metrics
            count.labels(name, "ok" if msg.ok else "failed").inc()
            if msg.ok:
                nbytes.labels(name).observe(msg.nbytes)
        if self.profile:
            print(f"disagg {msg.request_id}: decode side receive {msg.wire_s * 1e3:.3f} ms, unpack "
                  f"{msg.unpack_s * 1e3:.3f} ms, {msg.num_tokens} tokens ({msg.num_cached_tokens} prefix-cached there)"
                  f"{', waited for blocks' if msg.waited_for_blocks else ''}{'' if msg.ok else ' FAILED: ' + str(msg.error)}",
                  file=sys.stderr, flush=True)

    def finished(self, rid: str, reason: str | None, prompt_tokens: int, handed_off: bool, req: RequestTransfer,
                 topology: dict, backend: str) -> None:
        """One integrity record for a completed request (numbered even when no record file is written)."""
        self._sequence += 1
        if self._record is None:
            return
        t = self.totals
        rec = {"type": "disaggregated_runtime_integrity", "sequence": self._sequence, "request_id": rid,
               "finish_reason": reason, "handed_off": handed_off,
               "kv_transfer": {"count_total": t.count, "bytes_total": t.nbytes, "failed_total": t.failed,
                               "count_group": int(handed_off), "bytes_group": req.nbytes, "tokens_group": req.tokens,
                               "prompt_tokens": prompt_tokens, "waited_for_blocks": req.waited_for_blocks,
                               "waited_total": t.waited},
               "topology": topology, "transport": {"backend": backend, "kind": "CUDA IPC staging + gloo control" if backend == "cuda-ipc"
                             else "torch.distributed p2p"}}
        if self.profile:
            rec["timings_s"] = {"pack_total": t.pack_s, "send_total": t.send_s, "recv_total": t.recv_s,
                                "unpack_total": t.unpack_s, "group_transfer": req.seconds}
        self._record.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        if self._record is not None:
            self._record.close()
            self._record = None
