"""Workloads: seeded arrival processes, prompt/output length distributions and trace replay.

Everything is deterministic for a seed (``random.Random(seed)``; arrivals and lengths use separate
streams so changing a length distribution keeps the arrival times). Arrival gaps follow vLLM's
``bench serve``: gamma with shape ``burstiness`` and mean ``1 / rate`` (``burstiness == 1`` is Poisson,
``< 1`` burstier); ``rate == inf`` sends everything at t=0. On/off bursts send ``burst_size`` requests
back to back, then wait ``burst_size / rate`` on average. ``bench-serve`` draws its client arrivals from
``arrival_gap`` here (one implementation).

Trace replay reads JSONL (one ``{"arrival_s"|"timestamp", "prompt_len"|"input_len", "output_len"}`` per
line) or a bench-serve / vLLM-bench result JSON (``input_lens`` + ``output_lens``; arrivals re-drawn from
its ``request_rate``/``burstiness``).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from torchinferno.errors import ConfigError

__all__ = [
    "LengthDist",
    "SimRequest",
    "TrafficSpec",
    "arrival_gap",
    "arrival_times",
    "generate",
    "load_trace",
    "summarize_arrivals",
]


@dataclass
class SimRequest:
    """One request of a workload: ``prompt_token_ids`` (length = prompt length) arriving at ``arrival_s``,
    generating exactly ``output_len`` tokens (EOS ignored)."""

    request_id: str
    arrival_s: float
    prompt_token_ids: list[int]
    output_len: int
    prefix_group: int = -1  # shared-prefix group (-1: none); prefix-aware routing keys on the tokens anyway

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: ``fixed:N`` (or ``N``), ``uniform:LO:HI``, ``lognormal:MEAN:SIGMA``,
    ``exponential:MEAN``; samples are clipped to ``[1, cap]``."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str | int) -> LengthDist:
        s = str(text).strip()
        parts = s.split(":")
        try:
            if len(parts) == 1:
                return cls("fixed", float(int(parts[0])))
            kind, nums = parts[0], [float(x) for x in parts[1:]]
        except ValueError:
            raise ConfigError(f"cannot parse length distribution {text!r} (examples: 128, uniform:64:256, "
                              "lognormal:128:0.5, exponential:100)") from None
        want = {"fixed": 1, "uniform": 2, "lognormal": 2, "exponential": 1}
        if kind not in want or len(nums) != want[kind]:
            raise ConfigError(f"length distribution {text!r}: expected one of fixed:N, uniform:LO:HI, "
                              "lognormal:MEAN:SIGMA, exponential:MEAN")
        if nums[0] <= 0 or (kind == "uniform" and nums[1] < nums[0]):
            raise ConfigError(f"length distribution {text!r}: lengths must be positive and LO <= HI")
        return cls(kind, *nums)

    def sample(self, rng: random.Random, cap: int = 1 << 30) -> int:
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.randint(int(self.a), int(self.b))
        elif self.kind == "lognormal":  # a = mean of the distribution, b = sigma of log
            v = rng.lognormvariate(math.log(self.a) - self.b * self.b / 2, self.b)
        else:
            v = rng.expovariate(1.0 / self.a)
        return max(1, min(cap, round(v)))

    def __str__(self) -> str:
        return f"{int(self.a)}" if self.kind == "fixed" else f"{self.kind}:{self.a:g}" + (
            f":{self.b:g}" if self.kind in ("uniform", "lognormal") else "")


def arrival_gap(rng: random.Random, rate: float, burstiness: float = 1.0) -> float:
    """Seconds to the next arrival: gamma(shape=burstiness, mean=1/rate); 0 when ``rate`` is inf."""
    if math.isinf(rate):
        return 0.0
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0, burst_size: int = 1) -> list[float]:
    """``n`` arrival times from t=0: gamma gaps, or on/off bursts of ``burst_size`` requests."""
    if not rate > 0:
        raise ConfigError(f"request rate must be > 0 or inf, got {rate}")
    if not burstiness > 0:
        raise ConfigError(f"burstiness must be > 0, got {burstiness}")
    if burst_size < 1:
        raise ConfigError(f"burst size must be >= 1, got {burst_size}")
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        out.append(t)
        if (i + 1) % burst_size == 0:  # end of a burst (every request when burst_size == 1)
            t += arrival_gap(rng, rate / burst_size, burstiness)
    return out


@dataclass
class TrafficSpec:
    """A synthetic workload (see the module docstring). ``prefix_groups > 0`` gives every prompt one of that
    many shared prefixes of ``prefix_len`` tokens (prefix caching / prefix-aware routing)."""

    num_requests: int = 100
    rate: float = math.inf  # requests/s
    burstiness: float = 1.0
    burst_size: int = 1
    prompt_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 64))
    prefix_groups: int = 0
    prefix_len: int = 0
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ConfigError(f"number of requests must be >= 1, got {self.num_requests}")
        for name in ("prompt_len", "output_len"):
            v = getattr(self, name)
            if not isinstance(v, LengthDist):
                setattr(self, name, LengthDist.parse(v))


def _prompt(rng: random.Random, n: int, vocab: int, prefix: list[int]) -> list[int]:
    body = [rng.randrange(vocab) for _ in range(max(0, n - len(prefix)))]
    return (prefix + body)[:n] if prefix else body


def generate(spec: TrafficSpec) -> list[SimRequest]:
    """The workload of ``spec``, sorted by arrival (deterministic for ``spec.seed``)."""
    times = arrival_times(spec.num_requests, spec.rate, spec.burstiness, spec.seed, spec.burst_size)
    rng = random.Random(spec.seed + 1_000_003)
    prefixes = [[rng.randrange(spec.vocab_size) for _ in range(spec.prefix_len)] for _ in range(spec.prefix_groups)]
    out = []
    for i, t in enumerate(times):
        g = rng.randrange(spec.prefix_groups) if spec.prefix_groups else -1
        plen = spec.prompt_len.sample(rng) + (spec.prefix_len if g >= 0 else 0)
        olen = spec.output_len.sample(rng)
        out.append(SimRequest(f"req-{i}", t, _prompt(rng, plen, spec.vocab_size, prefixes[g] if g >= 0 else []),
                              olen, g))
    return out


def load_trace(path: str | Path, seed: int = 0, rate: float | None = None, vocab_size: int = 32000) -> list[SimRequest]:
    """Requests of a recorded trace (module docstring); ``rate`` overrides a result file's request rate."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"trace file not found: {p}")
    text = p.read_text()
    rng = random.Random(seed + 7)
    rows: list[tuple[float, int, int]] = []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "input_lens" in doc and "output_lens" in doc:
        ins, outs = doc["input_lens"], doc["output_lens"]
        r = rate if rate is not None else doc.get("request_rate", "inf")
        r = math.inf if r in ("inf", None) else float(r)
        # the gaps bench-serve drew: its result records its seed (results before session 29 do not: ``seed``)
        ts = arrival_times(len(ins), r, float(doc.get("burstiness", 1.0)), int(doc.get("seed", seed)))
        rows = [(t, int(i), int(o)) for t, i, o in zip(ts, ins, outs) if int(o) > 0]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                t = float(d.get("arrival_s", d.get("timestamp", 0.0)))
                pl = int(d.get("prompt_len", d.get("input_len")))
                ol = int(d["output_len"])
            except (json.JSONDecodeError, TypeError, KeyError, ValueError):
                raise ConfigError(f"{p}:{n}: expected a JSON object with arrival_s, prompt_len and output_len") from None
            rows.append((t, pl, ol))
        if rows:
            t0 = min(r[0] for r in rows)
            rows = sorted(((t - t0, a, b) for t, a, b in rows), key=lambda r: r[0])
    if not rows:
        raise ConfigError(f"trace {p} holds no requests")
    return [SimRequest(f"req-{i}", t, [rng.randrange(vocab_size) for _ in range(pl)], ol)
            for i, (t, pl, ol) in enumerate(rows)]


def summarize_arrivals(reqs: list[SimRequest]) -> dict:
    """Offered rate, gap statistics and lengths of a workload (``traffic-smoke``)."""
    ts = [r.arrival_s for r in reqs]
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    span = ts[-1] - ts[0] if len(ts) > 1 else 0.0
    mean = sum(gaps) / len(gaps) if gaps else 0.0
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps) if gaps else 0.0
    return {
        "requests": len(reqs),
        "span_s": span,
        "offered_rate": (len(ts) - 1) / span if span > 0 else math.inf,
        "gap_cv": math.sqrt(var) / mean if mean > 0 else 0.0,
        "mean_prompt_len": sum(r.prompt_len for r in reqs) / len(reqs),
        "mean_output_len": sum(r.output_len for r in reqs) / len(reqs),
    }
