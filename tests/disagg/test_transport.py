"""``disagg.transport.KVTransport``: both ranks in one process (two gloo groups on one store, one thread each):
the rows land exactly (every layer, every tensor), the payload is the live tokens' bytes, a missing sender fails
only that transfer, and a transfer-id mismatch breaks the transport (every later transfer fails at once)."""

import time

import pytest
import torch

from torchinferno.cache.kv_cache import allocate_kv_cache
from torchinferno.disagg.kv_io import live_kv_bytes, token_slots
from torchinferno.disagg.transport import KVTransport, TransportConfig, pick_backend
from torchinferno.models.protocol import KVLayerSpec, KVSpec
from torchinferno.ports import free_port

SPEC = KVSpec((KVLayerSpec("mha", (("k", (2, 3)), ("v", (2, 3)))),
               KVLayerSpec("mla", (("latent", (5,)), ("rope", (2,)), ("index", (4,))))))


def wait(tr, n=1, timeout=20.0):
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += tr.poll()
        time.sleep(0.005)
    assert len(out) == n
    return out


@pytest.fixture()
def pair():
    port = free_port()
    src = allocate_kv_cache(SPEC, 4, torch.float32, "cpu", num_blocks=8)
    dst = allocate_kv_cache(SPEC, 4, torch.float32, "cpu", num_blocks=8)
    for layer in src.tensors:
        for t in layer:
            t.normal_()
    tx = KVTransport(TransportConfig(0, "127.0.0.1", port, "gloo", 10.0), src)
    rx = KVTransport(TransportConfig(1, "127.0.0.1", port, "gloo", 10.0), dst)
    yield src, dst, tx, rx
    tx.close()
    rx.close()


def test_rows_move_exactly_then_a_bad_id_breaks_the_transport(pair):
    src, dst, tx, rx = pair
    src_blocks, dst_blocks = [5, 1, 6], [0, 7, 2]
    rx.submit("r", 1, dst_blocks, 2, 11)
    tx.submit("r", 1, src_blocks, 2, 11)
    (sent,), (got,) = wait(tx), wait(rx)
    assert sent.ok and got.ok and sent.nbytes == got.nbytes == live_kv_bytes(src, 9) == 9 * SPEC.bytes_per_token(torch.float32)
    s, d = token_slots(src_blocks, 4, 2, 11, "cpu"), token_slots(dst_blocks, 4, 2, 11, "cpu")
    untouched = token_slots(dst_blocks, 4, 0, 2, "cpu")
    for ls, ld in zip(src.tensors, dst.tensors):
        for a, b in zip(ls, ld):
            a, b = a.flatten(0, 1), b.flatten(0, 1)
            assert torch.equal(a[s], b[d]) and not b[untouched].any()

    rx.submit("m", 2, dst_blocks, 0, 4)
    tx.submit("m", 2, [], 0, 4, missing=True)  # the prefill side holds nothing for it
    (sent,), (got,) = wait(tx), wait(rx)
    assert not sent.ok and not got.ok and "no KV" in got.error and rx.broken is None

    rx.submit("x", 3, dst_blocks, 0, 4)
    tx.submit("x", 4, src_blocks, 0, 4)  # out of order: a protocol error
    (got,) = wait(rx)
    assert not got.ok and "expected KV transfer 3, got 4" in rx.broken
    rx.submit("y", 5, dst_blocks, 0, 4)
    (got,) = wait(rx, timeout=2)
    assert not got.ok and got.error == rx.broken


def test_backend_choice():
    assert pick_backend("cpu", "cpu") == "gloo"
    assert pick_backend("cuda:0", "cuda:0") == "cuda-ipc"  # NCCL refuses two ranks on one device: CUDA IPC staging
    assert pick_backend("cuda:0", "cuda:1") == "nccl"


def test_staged_chunks_move_exactly(monkeypatch):
    """The cuda-ipc protocol (payload through one shared staging buffer, chunk by chunk, each acknowledged before the
    buffer is reused), run on CPU: the two in-process sides share a CPU buffer instead of mapping a CUDA IPC handle,
    and the buffer is smaller than the payload so it moves in several chunks."""
    import torchinferno.disagg.transport as tp

    shared = torch.zeros(40, dtype=torch.uint8)
    monkeypatch.setattr(tp, "STAGING_BYTES", shared.numel())
    monkeypatch.setattr(tp.KVTransport, "_share_staging", lambda self: setattr(self, "_staging", shared))
    port = free_port()
    src = allocate_kv_cache(SPEC, 4, torch.float32, "cpu", num_blocks=8)
    dst = allocate_kv_cache(SPEC, 4, torch.float32, "cpu", num_blocks=8)
    for layer in src.tensors:
        for t in layer:
            t.normal_()
    tx = KVTransport(TransportConfig(0, "127.0.0.1", port, "cuda-ipc", 10.0), src)
    rx = KVTransport(TransportConfig(1, "127.0.0.1", port, "cuda-ipc", 10.0), dst)
    try:
        for tid, (a, b) in enumerate(((0, 7), (3, 12)), 1):
            rx.submit(f"r{tid}", tid, [0, 7, 2], a, b)
            tx.submit(f"r{tid}", tid, [5, 1, 6], a, b)
            (sent,), (got,) = wait(tx), wait(rx)
            assert sent.ok and got.ok and got.nbytes == live_kv_bytes(src, b - a) > 3 * shared.numel()
            s, d = token_slots([5, 1, 6], 4, a, b, "cpu"), token_slots([0, 7, 2], 4, a, b, "cpu")
            for ls, ld in zip(src.tensors, dst.tensors):
                for x, y in zip(ls, ld):
                    assert torch.equal(x.flatten(0, 1)[s], y.flatten(0, 1)[d])
    finally:
        tx.close()
        rx.close()
