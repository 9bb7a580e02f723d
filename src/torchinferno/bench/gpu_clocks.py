"""GPU clock, power and clock-limit reasons sampled through NVML while a benchmark runs, summarised per phase.

An H200 held at its power limit runs a long stream of bf16 matrix products at ~1.5 GHz instead of its ~2 GHz
boost clock (run 25: 1500-1515 MHz, reason "software power cap"), so a figure is read beside the clock it ran
at. NVML comes from ``pynvml`` (the ``nvidia-ml-py`` package) when installed; without it the sampler records
nothing and the benchmarks run unchanged. NVML's power reading is a moving average over up to a second, so a
phase shorter than that shows the power of what ran before it.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time

# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*): the ones that lower the clock.
REASONS = {0x1: "idle", 0x2: "application clocks setting", 0x4: "software power cap", 0x8: "hardware slowdown",
           0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown", 0x80: "power brake"}


def reason_names(bits: int) -> list[str]:
    """Names of the set bits of an NVML clock-event reason mask (unknown bits as hex)."""
    names = [name for bit, name in REASONS.items() if bits & bit]
    rest = bits & ~sum(REASONS)
    return names + ([hex(rest)] if rest else [])


class ClockSampler:
    """Samples (SM MHz, watts, reason bits, degrees C) every ``period`` s in a daemon thread, each tagged
    with the phase set by :meth:`phase`. ``nvml``: a ``pynvml``-like module (default: import ``pynvml``).

    Invariant: ``summary()`` only ever reports phases that were sampled; with NVML unavailable ``available``
    is False and ``summary()`` is empty.
    """

    def __init__(self, period: float = 0.01, nvml=None, device_index: int = 0):
        self.period, self.samples, self._phase = period, [], "idle"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.available = False
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            self._nv, self._h = nvml, nvml.nvmlDeviceGetHandleByIndex(device_index)
            self.available = True
        except Exception as e:  # no NVML library or driver: nothing is sampled
            self.error = f"{type(e).__name__}: {e}"

    def _read(self) -> tuple:
        nv, h = self._nv, self._h
        try:
            reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        except Exception:
            reasons = 0
        return (self._phase, nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), nv.nvmlDeviceGetPowerUsage(h) / 1000,
                reasons, nv.nvmlDeviceGetTemperature(h, 0))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._read())
            except Exception:  # a failed read skips one sample
                pass
            time.sleep(self.period)

    def start(self) -> ClockSampler:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def set_phase(self, name: str) -> None:
        """Tag the samples from now on with ``name``."""
        self._phase = name

    @contextlib.contextmanager
    def phase(self, name: str):
        """Tag the samples taken inside the block with ``name`` (phases do not nest)."""
        prev, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = prev

    def summary(self, phase: str | None = None) -> dict:
        """Per phase: sample count, median and min SM clock (MHz), median and max power (W), the union of
        the clock-limit reasons, max temperature; one phase's dict when ``phase`` is given ({} if unsampled)."""
        out = {}
        for name in dict.fromkeys(s[0] for s in self.samples):
            rows = [s for s in self.samples if s[0] == name]
            bits = 0
            for r in rows:
                bits |= r[3]
            out[name] = {"samples": len(rows), "sm_mhz_median": statistics.median(r[1] for r in rows),
                         "sm_mhz_min": min(r[1] for r in rows), "watts_median": statistics.median(r[2] for r in rows),
                         "watts_max": max(r[2] for r in rows), "limit_reasons": reason_names(bits),
                         "temp_c_max": max(r[4] for r in rows)}
        return out if phase is None else out.get(phase, {})


def fmt_clocks(s: dict) -> str:
    """One line for a phase summary ('' when unsampled)."""
    if not s:
        return ""
    why = ", ".join(s["limit_reasons"]) or "none"
    return (f"SM clock median {s['sm_mhz_median']:.0f} MHz (min {s['sm_mhz_min']:.0f}), power median "
            f"{s['watts_median']:.0f} W (max {s['watts_max']:.0f}), clock limited by: {why}")
