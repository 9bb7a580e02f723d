"""bench-gpu's report pieces that run without a GPU: the CPU ceilings, the NVML clock sampler (fake NVML),
and the summary table's (c) row against both matmul ceilings."""

import math
import time

import pytest
import torch

from torchinferno.bench.ceilings import matmul_rate, sustained_matmul_rate
from torchinferno.bench.gpu_bench import format_table, model_flops_prefill
from torchinferno.bench.gpu_clocks import ClockSampler, fmt_clocks, reason_names


def test_cpu_matmul_ceilings_are_finite_rates():
    burst = matmul_rate("cpu", torch.float32, n=128, iters=2)
    sus = sustained_matmul_rate("cpu", torch.float32, n=128, seconds=0.01, iters=3)
    assert math.isfinite(burst) and burst > 1e6
    assert math.isfinite(sus) and sus > 1e6


class FakeNVML:
    """pynvml's calls the sampler makes; the clock drops to 1500 MHz under a power cap after ``switch``."""

    NVML_CLOCK_SM = 1

    def __init__(self):
        self.capped = False

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, h, which):
        assert which == self.NVML_CLOCK_SM
        return 1500 if self.capped else 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return 699_000 if self.capped else 120_000  # milliwatts

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4 if self.capped else 0x0

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 55


def _wait_for(sampler, phase, n=3):
    deadline = time.time() + 5
    while sum(s[0] == phase for s in sampler.samples) < n and time.time() < deadline:
        time.sleep(0.005)


def test_clock_sampler_summarises_each_phase():
    nv = FakeNVML()
    clock = ClockSampler(period=0.001, nvml=nv).start()
    with clock.phase("boost"):
        _wait_for(clock, "boost")
    nv.capped = True
    with clock.phase("capped"):
        _wait_for(clock, "capped")
    clock.stop()
    s = clock.summary()
    assert s["boost"]["sm_mhz_median"] == 1980 and s["boost"]["limit_reasons"] == []
    capped = clock.summary("capped")
    assert capped["sm_mhz_median"] == 1500 and capped["watts_max"] == pytest.approx(699.0)
    assert capped["limit_reasons"] == ["software power cap"]
    assert "1500 MHz" in fmt_clocks(capped) and "software power cap" in fmt_clocks(capped)
    assert clock.summary("never") == {} and fmt_clocks({}) == ""


def test_clock_sampler_without_nvml_records_nothing():
    class Broken:
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    clock = ClockSampler(nvml=Broken()).start()
    with clock.phase("x"):
        pass
    clock.stop()
    assert not clock.available and "NVML" in clock.error and clock.summary() == {}


def test_reason_names_keeps_unknown_bits():
    assert reason_names(0x4 | 0x40) == ["software power cap", "hardware thermal slowdown"]
    assert reason_names(0x1000) == ["0x1000"]


def test_table_puts_prefill_against_burst_and_sustained_matmul():
    from torchinferno.models.registry import get_family

    cfg = get_family("llama3").size("llama3-8b")
    flops = model_flops_prefill(cfg, 2048)
    ms = flops / 620e9  # 620 TFLOP/s
    rep = {"ceilings": {"copy_gb_s": 4200.0, "bf16_matmul_tflop_s": 788.0, "bf16_matmul_sustained_tflop_s": 680.0},
           "prefill": {"tokens": 2048, "ms": ms, "tflop_s": flops / ms / 1e9}}
    table = format_table(rep)
    row = next(line for line in table.splitlines() if line.startswith("| (c)"))
    assert "620 TFLOP/s" in row and "79% of matmul burst 788" in row and "91% of sustained 680" in row
    assert "| bf16 matmul 8192^3, ~50 ms back to back (sustained) | 680 TFLOP/s |" in table
    # 8B prefill FLOPs: 2 x ~7B linear params x 2048 tokens + causal attention, ~29.7 TFLOP
    assert 29e12 < flops < 30.5e12
