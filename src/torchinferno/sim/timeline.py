"""Timeline cost model: a step's wall time is host work overlapped with device work, in the engine's order.

Per scheduled batch (``BatchShape``) the model prices, in seconds (``PARAMS``; a ``TimelineModel`` holds one
value per name, all >= 0):

* host, before the launch (scheduling, input preparation, message handling of the loop):
  ``host_step + host_seq * rows + host_token * tokens + host_batched * [rows > 1]`` (``host_batched``: the host
  side of the step-shaped cost between one row and two, the counterpart of the device's ``batched``: run 37's
  logged decode step is 4.09 ms at 1 row, 4.90 at 2, 5.11 at 16, 10.0 at 256, which a row-linear host story
  cannot follow);
* host, the launch itself: ``launch_eager + launch_eager_seq * rows`` for a step that runs op by op (a step with a
  prefill chunk, or every step without CUDA graphs; run 45's eager launch grows from ~20 ms at one row to ~30 at 64
  and ~45 at 256 while a graph step's host side stays ~1-4 ms), ``launch_graph`` for a replayed graph
  (``graphs=True``: pure decode steps, and with ``prefill_graph_tokens`` a step that is one fresh prompt of at most
  that many tokens, as the engine's runner replays it: :func:`graph_step`), ``launch_piecewise +
  launch_piecewise_seq * rows`` for any other step of at most ``piecewise_graph_tokens`` tokens on a graph engine
  (graphed segments around eager attention, ``kernels.cuda_graphs_piecewise``; its kernels start as launched, as an
  eager step's do: :func:`piecewise_step`); with ``mixed_graph_tokens`` (``--cuda-graph-mixed-mode full``) every step
  of at most that many tokens replays one whole graph instead, priced as a graph step (``launch_graph``);
* host, applying a result (``update_from_output``, output encoding): ``apply_row * rows`` of the resolved batch;
* device, a roofline: ``max(weights + kv_token * decode_ctx + kv_padded * decode_rows * longest_ctx,
  flop_token * tokens) + token * tokens + seq * rows + attn_pair * prefill_pairs / 1e3 + batched * [rows > 1]``
  (bytes / bandwidth vs flops / rate, plus per-token and per-attention-pair work that neither bound holds;
  ``batched``: the step of one row has its own fused path on CUDA, so a batch pays a fixed extra).

Order (``Timeline``, one per replica; the same rules in ``timeline_fit``'s replay and in ``SimulatedExecutor``):

* a step starts on the host at ``s``; its launch ends at ``L = s + pre + launch``;
* ``overlap`` (a GPU): an eager step's kernels start as soon as they are launched, so its device work runs from
  ``max(device free, s + pre)`` and ends no earlier than ``L``; a graph replay starts at ``max(device free, L)``.
  Without ``overlap`` (a CPU engine: the host thread is the device) the device work runs on the host after the
  launch: ``L += device``;
* taking a step's result waits for its device end, then pays its apply time;
* async scheduling (``EngineCore``): step k+1 is launched before step k's result is taken, so step k+1's host
  work overlaps step k's device work; the synchronous engine takes each result right after its launch.

Invariants: the host clock only grows; the device clock only grows; a step's device end is >= its launch end.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from torchinferno.engine.outputs import SchedulerOutput
from torchinferno.errors import ConfigError

__all__ = ["DEVICE_PARAMS", "HOST_PARAMS", "PARAMS", "BatchShape", "Timeline", "TimelineModel", "batch_shape",
           "graph_step", "piecewise_step"]

HOST_PARAMS = ("host_step", "host_seq", "host_token", "host_batched", "launch_eager", "launch_eager_seq", "launch_graph",
               "apply_row", "launch_piecewise", "launch_piecewise_seq")
DEVICE_PARAMS = ("weights", "kv_token", "kv_padded", "flop_token", "token", "seq", "attn_pair", "batched")
PARAMS = HOST_PARAMS + DEVICE_PARAMS


@dataclass(frozen=True)
class BatchShape:
    """What a step's cost depends on (``engine.step_log.StepShape``'s fields, external prefills removed)."""

    seqs: int = 0
    tokens: int = 0
    decode_seqs: int = 0
    prefill_tokens: int = 0
    decode_ctx: int = 0
    decode_ctx_max: int = 0
    prefill_attn: float = 0.0  # sum over prefill chunks of chunk * (start + chunk / 2), / 1e3

    @classmethod
    def from_log(cls, row: dict) -> BatchShape:
        return cls(int(row.get("seqs", 0)), int(row.get("tokens", 0)), int(row.get("decode_seqs", 0)),
                   int(row.get("prefill_tokens", 0)), int(row.get("decode_ctx", 0)), int(row.get("decode_ctx_max", 0)),
                   float(row.get("prefill_attn", 0.0)))


def batch_shape(sched: SchedulerOutput, external_prefill: frozenset | set = frozenset()) -> BatchShape:
    """The shape of a scheduled batch (decode rows: one sampled token past a computed prefix, as
    ``step_log.step_shape`` splits them); prefill rows of ``external_prefill`` requests cost nothing."""
    seqs = dec = pre = ctx = ctx_max = 0
    attn = 0.0
    for s in sched.scheduled:
        n = len(s.token_ids)
        start = s.num_computed_tokens
        if n == 1 and s.sample and start > 0:
            seqs += 1
            dec += 1
            ctx += start + 1
            if start + 1 > ctx_max:
                ctx_max = start + 1
        elif s.request_id not in external_prefill:
            seqs += 1
            pre += n
            attn += n * (start + n * 0.5)
    return BatchShape(seqs, dec + pre, dec, pre, ctx, ctx_max, attn * 1e-3)


def graph_step(shape: BatchShape, graphs: bool, prefill_graph_tokens: int = 0, mixed_graph_tokens: int = 0) -> bool:
    """The engine replays this batch from a CUDA graph (``engine.model_runner.graph_prefillable`` and the decode
    graphs): ``graphs`` and either a pure decode batch, one fresh prompt (no decode rows, no cached context:
    ``prefill_attn == n * n / 2 / 1e3``) of ``n <= prefill_graph_tokens`` tokens, or any batch of at most
    ``mixed_graph_tokens`` tokens (whole-step graphs, ``kernels.cuda_graphs_mixed``)."""
    if not graphs:
        return False
    n = shape.prefill_tokens
    if n == 0 or shape.tokens <= mixed_graph_tokens:
        return True
    # a cached context of c >= 1 tokens adds n * c / 1e3 >= 1e-3 to the pairs: beyond the logged rounding
    return (shape.seqs == 1 and shape.decode_seqs == 0 and n <= prefill_graph_tokens
            and abs(shape.prefill_attn - n * n * 5e-4) < 5e-4)


def piecewise_step(shape: BatchShape, graphs: bool, piecewise_graph_tokens: int = 0) -> bool:
    """A step that :func:`graph_step` does not replay whole runs from piecewise graphs (``engine.model_runner``):
    ``graphs`` and at most ``piecewise_graph_tokens`` tokens. Call it only for steps that are not graph steps."""
    return graphs and 0 < shape.tokens <= piecewise_graph_tokens


def _launch_features(shape: BatchShape, eager: bool, piecewise: bool) -> dict:
    if not eager:
        return {"launch_graph": 1.0}
    if piecewise:
        return {"launch_piecewise": 1.0, "launch_piecewise_seq": float(shape.seqs)}
    return {"launch_eager": 1.0, "launch_eager_seq": float(shape.seqs)}


def param_features(shape: BatchShape, graphs: bool, prefill_graph_tokens: int = 0,
                   piecewise_graph_tokens: int = 0, mixed_graph_tokens: int = 0) -> tuple[dict, dict, dict, dict, dict]:
    """Coefficients of each part of a step on ``PARAMS``: ``(pre, launch, apply, memory, compute+extra)``.
    The device time is ``max(memory, compute) + extra``; ``compute`` is the ``flop_token`` term alone."""
    eager = not graph_step(shape, graphs, prefill_graph_tokens, mixed_graph_tokens)
    pre = {"host_step": 1.0, "host_seq": float(shape.seqs), "host_token": float(shape.tokens),
           "host_batched": 1.0 if shape.seqs > 1 else 0.0}
    launch = _launch_features(shape, eager, eager and piecewise_step(shape, graphs, piecewise_graph_tokens))
    apply = {"apply_row": float(shape.seqs)}
    mem = {"weights": 1.0, "kv_token": float(shape.decode_ctx),
           "kv_padded": float(shape.decode_seqs * shape.decode_ctx_max)}
    comp = {"flop_token": float(shape.tokens)}
    return pre, launch, apply, mem, comp


def extra_features(shape: BatchShape) -> dict:
    return {"token": float(shape.tokens), "seq": float(shape.seqs), "attn_pair": float(shape.prefill_attn),
            "batched": 1.0 if shape.seqs > 1 else 0.0}


@dataclass
class TimelineModel:
    """Fitted per-part costs (module docstring). ``graphs``: pure decode steps replay a CUDA graph;
    ``prefill_graph_tokens``: so does one fresh prompt of at most this many tokens (:func:`graph_step`; 0: the
    engine's prefill ran eagerly); ``overlap``: a device separate from the host (CUDA); ``async_scheduling``: how the
    calibrated engine ran (informational: the simulated core's own config decides the order);
    ``piecewise_graph_tokens``: any other step of at most this many tokens runs from piecewise graphs
    (:func:`piecewise_step`; 0: eagerly); ``mixed_graph_tokens``: any step of at most this many tokens replays one
    whole graph (:func:`graph_step`; 0: none; :meth:`with_mixed_graphs` turns piecewise steps into such ones)."""

    params: dict = field(default_factory=lambda: dict.fromkeys(PARAMS, 0.0))
    graphs: bool = False
    prefill_graph_tokens: int = 0
    piecewise_graph_tokens: int = 0
    mixed_graph_tokens: int = 0
    overlap: bool = False
    async_scheduling: bool = False
    empty_step_s: float = 0.0  # a step that scheduled nothing: host only
    kind: str = "timeline"

    def __post_init__(self) -> None:
        unknown = set(self.params) - set(PARAMS)
        if unknown:
            raise ConfigError(f"unknown timeline parameters {sorted(unknown)} (valid: {', '.join(PARAMS)})")
        self.params = {k: float(self.params.get(k, 0.0)) for k in PARAMS}
        if any(v < 0 for v in self.params.values()):
            raise ConfigError("timeline parameters must be >= 0")

    # ------------------------------------------------------------------ parts of one step
    def eager(self, shape: BatchShape) -> bool:
        """The engine runs this batch eagerly (no CUDA graph replays it: :func:`graph_step`)."""
        return not graph_step(shape, self.graphs, self.prefill_graph_tokens, self.mixed_graph_tokens)

    def parts(self, shape: BatchShape, eager: bool | None = None) -> tuple[float, float, float, float]:
        """``(pre, launch, device, apply)`` seconds of a batch (module docstring); ``eager``: ``self.eager(shape)``
        when the caller has it already."""
        if eager is None:
            eager = self.eager(shape)
        p = self.params
        pre = p["host_step"] + p["host_seq"] * shape.seqs + p["host_token"] * shape.tokens \
            + (p["host_batched"] if shape.seqs > 1 else 0.0)
        if not eager:
            launch = p["launch_graph"]
        elif piecewise_step(shape, self.graphs, self.piecewise_graph_tokens):
            launch = p["launch_piecewise"] + p["launch_piecewise_seq"] * shape.seqs
        else:
            launch = p["launch_eager"] + p["launch_eager_seq"] * shape.seqs
        mem = p["weights"] + p["kv_token"] * shape.decode_ctx + p["kv_padded"] * shape.decode_seqs * shape.decode_ctx_max
        comp = p["flop_token"] * shape.tokens
        dev = (mem if mem > comp else comp) + p["token"] * shape.tokens + p["seq"] * shape.seqs \
            + p["attn_pair"] * shape.prefill_attn + (p["batched"] if shape.seqs > 1 else 0.0)
        return pre, launch, dev, p["apply_row"] * shape.seqs

    def step_seconds(self, shape: BatchShape) -> float:
        """A step alone on an idle engine, result taken at once (the synchronous period)."""
        t = Timeline(self)
        end = t.launch(0.0, shape)
        return t.resolve(end, t.last_device_end, shape)

    # ------------------------------------------------------------------ transforms (cluster.py, what-ifs)
    def with_mixed_graphs(self) -> TimelineModel:
        """What-if ``--cuda-graph-mixed-mode full``: the steps this engine ran from piecewise graphs replay one whole
        graph each (host: ``launch_graph``, the decode graphs' launch; device work unchanged, started after the launch
        as a replay's is). Unchanged when it ran none that way."""
        if not self.graphs or self.piecewise_graph_tokens <= 0:
            return self
        return replace(self, mixed_graph_tokens=max(self.mixed_graph_tokens, self.piecewise_graph_tokens),
                       piecewise_graph_tokens=0)

    def with_kv_bytes(self, ratio: float) -> TimelineModel:
        p = dict(self.params)
        for k in ("kv_token", "kv_padded", "attn_pair"):
            p[k] *= ratio
        return replace(self, params=p)

    def with_tp(self, tp: int, link, hidden_size: int, num_layers: int, act_bytes: int = 2,
                efficiency: float = 0.9) -> TimelineModel:
        """Device terms divide by ``tp * efficiency``; two ring all-reduces of the hidden state per layer add
        latency per step and bytes per token (as ``CostModel.with_tp``); host terms stay."""
        if tp == 1:
            return self
        p = dict(self.params)
        for k in DEVICE_PARAMS:
            p[k] /= tp * efficiency
        p["token"] += 2 * num_layers * 2 * (tp - 1) / tp * hidden_size * act_bytes / link.bandwidth_Bps
        p["weights"] += 2 * num_layers * 2 * (tp - 1) * link.latency_s
        return replace(self, params=p)

    # ------------------------------------------------------------------ file form
    def as_dict(self) -> dict:
        return {"kind": self.kind, "params": dict(self.params), "graphs": self.graphs,
                "prefill_graph_tokens": self.prefill_graph_tokens,
                "piecewise_graph_tokens": self.piecewise_graph_tokens, "mixed_graph_tokens": self.mixed_graph_tokens,
                "overlap": self.overlap,
                "async_scheduling": self.async_scheduling, "empty_step_s": self.empty_step_s}

    @classmethod
    def from_dict(cls, d: dict) -> TimelineModel:
        if not isinstance(d, dict) or d.get("kind") != "timeline":
            raise ConfigError(f"not a timeline cost model (kind {d.get('kind')!r})")
        return cls(params=dict(d["params"]), graphs=bool(d.get("graphs", False)),
                   prefill_graph_tokens=int(d.get("prefill_graph_tokens", 0)),
                   piecewise_graph_tokens=int(d.get("piecewise_graph_tokens", 0)),
                   mixed_graph_tokens=int(d.get("mixed_graph_tokens", 0)), overlap=bool(d.get("overlap", False)),
                   async_scheduling=bool(d.get("async_scheduling", False)),
                   empty_step_s=float(d.get("empty_step_s", 0.0)))


class Timeline:
    """One replica's host/device clocks under a ``TimelineModel`` (module docstring's order rules).

    ``launch(start, shape) -> host time after the launch`` (it also sets ``last_device_end``);
    ``resolve(now, device_end, shape) -> host time after the result is taken and applied``."""

    __slots__ = ("device_free", "last_device_end", "model")

    def __init__(self, model: TimelineModel):
        self.model = model
        self.device_free = 0.0
        self.last_device_end = 0.0

    def launch(self, start: float, shape: BatchShape | None) -> float:
        m = self.model
        if shape is None or shape.seqs == 0:  # scheduled nothing: scheduling only
            self.last_device_end = self.device_free
            return start + m.params["host_step"] + m.empty_step_s
        eager = m.eager(shape)
        pre, launch, dev, _ = m.parts(shape, eager)
        end = start + pre + launch
        if not m.overlap:  # the host runs the forward itself
            end += dev
            dev_end = end
        elif eager:  # kernels run as they are launched
            dev_end = max(max(self.device_free, start + pre) + dev, end)
        else:  # graph replay: starts once launched
            dev_end = max(self.device_free, end) + dev
        self.device_free = max(self.device_free, dev_end)
        self.last_device_end = dev_end
        return end

    def resolve(self, now: float, device_end: float, shape: BatchShape | None = None) -> float:
        apply = self.model.params["apply_row"] * shape.seqs if shape is not None else 0.0
        return max(now, device_end) + apply
