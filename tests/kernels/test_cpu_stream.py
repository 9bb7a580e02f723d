"""The native read-bandwidth probe reads every byte once (its checksum is the XOR of the buffer's 64-bit words) and
bench ceilings use it on CPU."""

import pytest
import torch

from torchinferno.bench.ceilings import read_bandwidth
from torchinferno.kernels import cpu_stream


@pytest.fixture(scope="module")
def probe():
    fn = cpu_stream.load()
    if fn is None:
        pytest.skip("no AVX2 or no gcc: the probe falls back to torch")
    return fn


@pytest.mark.parametrize("nthreads", [1, 2])
def test_checksum_is_xor_of_every_word(probe, nthreads):
    g = torch.Generator().manual_seed(0)
    words = torch.randint(-2**62, 2**62, (4096 * nthreads,), generator=g, dtype=torch.int64)  # 256-byte chunks
    expect = 0
    for w in words.tolist():
        expect ^= w & (2**64 - 1)
    assert probe(words.data_ptr(), words.numel() * 8, nthreads) == expect
    words[-1] ^= 1  # the last word is read too
    assert probe(words.data_ptr(), words.numel() * 8, nthreads) == expect ^ 1


def test_cpu_read_bandwidth_uses_the_probe(probe, monkeypatch):
    calls = []

    def counting(ptr, nbytes, nthreads):
        calls.append((nbytes, nthreads))
        return probe(ptr, nbytes, nthreads)

    monkeypatch.setattr(cpu_stream, "load", lambda: counting)
    bw = read_bandwidth("cpu", nbytes=64 * 1024**2, iters=2)
    assert 1e8 < bw < 1e13
    assert calls == [(64 * 1024**2, torch.get_num_threads())] * 3  # one warm-up + iters
