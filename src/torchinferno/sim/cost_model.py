"""Per-step cost model: seconds of one engine step as a function of what the scheduler put in it.

Features of a step (``step_features``), from the ``SchedulerOutput`` alone:

* ``seqs``: rows in the forward; ``prefill_tokens``: tokens of prefill chunks; ``decode_tokens``: decode rows;
* ``decode_ctx``: total context the decode rows attend over (KV tokens read);
* ``prefill_attn``: sum over prefill chunks of ``chunk * (start + chunk / 2)`` / 1000 (query x key pairs / 1e3);
* ``excess_tokens``: ``max(0, tokens - knee)``: the piecewise term (compute-bound past a knee in tokens);
* ``decode_ctx_padded``: decode rows x the longest decode context (attention that pads the batch to its longest
  sequence, as the torch paged decode does, costs this rather than ``decode_ctx``);
* ``prefill_step``: 1 when the step holds a prefill chunk, else 0. On CUDA a pure decode step replays a CUDA
  graph while a step with a prefill chunk runs eagerly: a fixed host launch cost (~35-90 ms for an 8B model
  in run33) that neither token count explains;
* ``drained_prefill``: 1 when the step holds a prefill chunk and was launched, under async scheduling, with
  no step in flight (the first step of a burst: on CUDA its launch took ~90-100 ms in run33 against ~35-45 ms
  behind a running decode). Always 0 in the synchronous engine.

``cost = c0 + sum(coef[f] * feature[f])``, fitted by non-negative least squares on measured steps
(``fit``; numpy), with the knee picked from candidates by residual. The cost covers the whole engine step
(scheduling, forward, sampling, bookkeeping) when fitted on whole-step wall times, as ``sim-calibrate`` does.

KV dtype: context terms scale with the KV bytes per element (``with_kv_bytes``). Tensor parallelism
(``with_tp``): every term, the constant too (on a GPU it is mostly the weight read), divides by
``tp * efficiency``; two ring all-reduces of the hidden state per layer add
``2 * layers * 2 * (tp - 1) * latency`` per step and ``2 * layers * 2 * (tp - 1) / tp * hidden * bytes / bw``
per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from torchinferno.engine.outputs import SchedulerOutput
from torchinferno.errors import ConfigError

__all__ = ["FEATURES", "FIT_WEIGHTS", "CostModel", "LinkModel", "fit", "step_features"]

FEATURES = ("seqs", "prefill_tokens", "decode_tokens", "decode_ctx", "prefill_attn", "excess_tokens",
            "decode_ctx_padded", "prefill_step", "drained_prefill")


def step_features(sched: SchedulerOutput, knee: float = 0.0,
                  external_prefill: frozenset | set = frozenset(), drained: bool = False) -> tuple[float, ...]:
    """The feature vector of one step (order of ``FEATURES``). Rows of requests in ``external_prefill`` whose
    chunk is a prefill cost nothing (their KV arrived from a prefill replica). ``drained``: launched under
    async scheduling with nothing in flight."""
    seqs = ptok = dtok = dctx = pattn = maxctx = 0
    for s in sched.scheduled:
        n = len(s.token_ids)
        start = s.num_computed_tokens
        if n == 1 and s.sample and start > 0:  # decode row (a 1-token prompt is a prefill, start == 0)
            seqs += 1
            dtok += 1
            dctx += start + 1
            if start >= maxctx:
                maxctx = start + 1
            continue
        if s.request_id in external_prefill:
            continue
        seqs += 1
        ptok += n
        pattn += n * (start + n * 0.5)
    tokens = ptok + dtok
    return (seqs, ptok, dtok, dctx, pattn * 1e-3, max(0.0, tokens - knee) if knee > 0 else 0.0, dtok * maxctx,
            1.0 if ptok else 0.0, 1.0 if ptok and drained else 0.0)


@dataclass(frozen=True)
class LinkModel:
    """A network link: one-way latency and bandwidth (bytes/s)."""

    latency_s: float = 5e-6
    bandwidth_Bps: float = 400e9

    def transfer_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass
class CostModel:
    """``cost = c0 + coef . features`` seconds (module docstring). ``knee`` in tokens (0: no piecewise term)."""

    c0: float = 0.0
    coef: dict = field(default_factory=lambda: dict.fromkeys(FEATURES, 0.0))
    knee: float = 0.0
    empty_step_s: float = 0.0  # a step that scheduled nothing (only preemptions)

    def __post_init__(self) -> None:
        unknown = set(self.coef) - set(FEATURES)
        if unknown:
            raise ConfigError(f"unknown cost-model features {sorted(unknown)} (valid: {', '.join(FEATURES)})")
        self.coef = {f: float(self.coef.get(f, 0.0)) for f in FEATURES}
        self._vec = tuple(self.coef[f] for f in FEATURES)

    @classmethod
    def per_token(cls, prefill_s: float, decode_s: float, step_s: float = 0.0) -> CostModel:
        """Explicit costs (``sim-smoke --prefill-us-per-token --decode-us-per-token``)."""
        return cls(c0=step_s, coef={"prefill_tokens": prefill_s, "decode_tokens": decode_s})

    def predict(self, feats: tuple[float, ...]) -> float:
        c = self.c0
        for w, x in zip(self._vec, feats):
            c += w * x
        return c

    def step_cost(self, sched: SchedulerOutput, external_prefill=frozenset(), drained: bool = False) -> float:
        if not sched.scheduled:
            return self.empty_step_s
        return self.predict(step_features(sched, self.knee, external_prefill, drained))

    def with_kv_bytes(self, ratio: float) -> CostModel:
        """Context terms scaled by the KV bytes ratio (target dtype bytes / calibrated dtype bytes)."""
        coef = dict(self.coef)
        for f in ("decode_ctx", "decode_ctx_padded", "prefill_attn"):
            coef[f] *= ratio
        return replace(self, coef=coef)

    def with_tp(self, tp: int, link: LinkModel, hidden_size: int, num_layers: int, act_bytes: int = 2,
                efficiency: float = 0.9) -> CostModel:
        """The cost of one TP group of ``tp`` ranks (module docstring); ``efficiency`` of the compute split."""
        if tp == 1:
            return self
        coef = {f: v / (tp * efficiency) for f, v in self.coef.items()}
        per_token = 2 * num_layers * 2 * (tp - 1) / tp * hidden_size * act_bytes / link.bandwidth_Bps
        coef["prefill_tokens"] += per_token
        coef["decode_tokens"] += per_token
        c0 = self.c0 / (tp * efficiency) + 2 * num_layers * 2 * (tp - 1) * link.latency_s
        return replace(self, c0=c0, coef=coef)

    def as_dict(self) -> dict:
        return {"c0": self.c0, "coef": dict(self.coef), "knee": self.knee, "empty_step_s": self.empty_step_s}

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        return cls(c0=float(d["c0"]), coef=dict(d["coef"]), knee=float(d.get("knee", 0.0)),
                   empty_step_s=float(d.get("empty_step_s", 0.0)))


def _nnls(a, b):
    """Non-negative least squares by an active set of lstsq fits (few features: plenty)."""
    import numpy as np

    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active = [j for j, v in zip(active, sol) if v > 0] if (sol > 0).any() else []
    return x


FIT_WEIGHTS = ("relative", "sqrt", "time")


def _fit_once(x, y, knee: float, use: list[int], async_steps: bool = False, weights: str = "relative"):
    import numpy as np

    xk = x.copy()
    tokens = x[:, 1] + x[:, 2]
    xk[:, 5] = np.maximum(0.0, tokens - knee) if knee > 0 else 0.0
    cols = [j for j in use if knee > 0 or j != 5]
    design = np.concatenate([np.ones((len(y), 1)), xk[:, cols]], axis=1)
    if async_steps:  # last column: "this row's own step had no prefill" (a decode step's device wait)
        design = np.concatenate([design, (x[:, 1] == 0).astype(np.float64)[:, None]], axis=1)
    # relative: every step counts alike (thousands of decode steps outvote a few long prefills); time: seconds
    # count (the long steps, which set TTFT under load, are fitted best); sqrt: between the two
    w = {"relative": 1.0 / np.maximum(y, 1e-9), "sqrt": 1.0 / np.sqrt(np.maximum(y, 1e-9)),
         "time": np.ones_like(y)}[weights]
    a = design * w[:, None]
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)  # column scaling: a well-conditioned solve
    sol = _nnls(a / scale, y * w) / scale
    rel = (design @ sol - y) / np.maximum(y, 1e-12)
    return sol, cols, rel


def fit(rows: list[tuple[tuple[float, ...], float]], knees=(0.0,), features=FEATURES,
        trim: float = 3.0, async_steps: bool = False, weights: str = "relative") -> tuple[CostModel, float]:
    """Fit a ``CostModel`` to ``(features, seconds)`` rows (features computed with knee 0; the excess term is
    recomputed per knee candidate from ``prefill_tokens + decode_tokens``). Only ``features`` are free.

    Robust to interference (a shared machine): after a first fit, steps measured slower than predicted by
    more than ``trim`` x the median |relative error| are dropped and the fit is redone. A knee is kept only
    when it lowers the error by more than 10% relative to no knee. Returns the model and its mean |relative
    error| on the rows it kept. ``weights`` (``FIT_WEIGHTS``): how rows count in the least squares.

    ``async_steps``: rows timed under async scheduling (``calibrate.StepAttribution``), where a row is the
    resolved step's wait plus the launch of the *next* step, and ``prefill_step`` flags that launch. An eager
    step's device work runs during its own launch, so its wait is short while a graph decode's is the whole
    forward: a column ``D = [the row's step has no prefill]`` takes that wait. Per step, the model is then
    ``c0 + D`` and ``prefill_step`` weighs ``launch - D`` (clamped at 0): the same total time, charged to the
    step that causes it. A ``drained_prefill`` row holds its own launch (carried), so its per-step weight is
    the row weight less ``launch`` (the per-step ``c0 + prefill_step`` already pays that much)."""
    import numpy as np

    if len(rows) < 3:
        raise ConfigError(f"need at least 3 measured steps to fit a cost model, got {len(rows)}")
    if weights not in FIT_WEIGHTS:
        raise ConfigError(f"unknown fit weights {weights!r} (valid: {', '.join(FIT_WEIGHTS)})")
    nf = len(FEATURES)
    x = np.array([tuple(r[0]) + (0.0,) * (nf - len(r[0])) for r in rows], dtype=np.float64)  # [N, F], short rows padded
    y = np.array([r[1] for r in rows], dtype=np.float64)  # [N]
    use = [FEATURES.index(f) for f in features]
    best = None
    for knee in sorted(set(knees)):
        sol, cols, rel = _fit_once(x, y, knee, use, async_steps, weights)
        if trim:
            mad = float(np.median(np.abs(rel)))
            keep = rel > -trim * max(mad, 1e-3)  # measured much slower than predicted: interference
            if keep.sum() >= max(3, len(y) // 2) and not keep.all():
                sol, cols, rel2 = _fit_once(x[keep], y[keep], knee, use, async_steps, weights)
                rel = rel2
        err = float(np.mean(np.abs(rel)))
        if best is None or err < best[0] * (0.9 if best[1].knee == 0 else 1.0):
            coef = dict.fromkeys(FEATURES, 0.0)
            for j, v in zip(cols, sol[1:]):
                coef[FEATURES[j]] = float(v)
            c0 = float(sol[0])
            if async_steps:  # row terms -> per-step terms (docstring)
                d, launch = float(sol[-1]), coef["prefill_step"]
                c0 += d
                coef["prefill_step"] = max(0.0, launch - d)
                coef["drained_prefill"] = max(0.0, coef["drained_prefill"] - launch)
            best = (err, CostModel(c0=c0, coef=coef, knee=float(knee)))
    return best[1], best[0]
