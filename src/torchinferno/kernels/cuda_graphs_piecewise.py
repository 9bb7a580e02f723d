"""Piecewise CUDA graphs: every op of a forward but attention replayed from graphs, attention eager between them.

A step that mixes decodes with prefill chunks (or holds several prompts, or a prefix-cache hit) cannot replay a whole
graph: its attention reads host lengths (``paged_prefill_attention``'s ``query_lens_list`` / ``seq_lens_list``) that a
graph would freeze. Everything else in a dense decoder is row-wise and depends only on the number of rows, and that
part is what makes the eager step host-bound: on an 8B Llama under ``serve`` the mixed eager steps took 24-55 ms of
host time against ~1 ms of device time for a graph prefill (run 73's step logs). So the forward is cut at its
attention calls: for a token-count bucket ``Tb``, segment ``i`` (embedding or the previous attention's output up to
the next attention's q/k/v) is one graph, and each attention runs eagerly on the step's real metadata in between.
A step of ``n <= Tb`` tokens then costs ``L + 1`` graph replays plus ``L`` eager attention calls (``L`` layers).

``PiecewiseGraphRunner`` owns static buffers sized for the largest bucket: ``input_ids`` / ``positions`` (inputs of
segment 0), ``q`` / ``k`` / ``v`` (the attention inputs every segment writes last, inside its graph) and ``o`` (the
attention output every segment but the first reads first). One set serves every layer and bucket: segment ``i + 1``
has read ``o`` before attention ``i + 1`` overwrites it (one stream), and buckets are replayed one whole step at a
time, so the buckets also share one graph memory pool.

Padded rows ``n <= t < Tb`` cannot change a live row: attention runs on the live rows only (``q[:n]`` with the
step's metadata, which also does the KV append for exactly the live rows), and every other op is row-wise. Rows
``n..Tb`` of ``o`` keep whatever an earlier step left there (finite values; they feed padded rows only). Models
qualify when every attention module declares ``supports_piecewise_graphs`` (``TritonPagedAttention``; a family whose
other ops mix rows, e.g. capacity-limited routing, must not), and the attention call has the ``TorchAttention``
signature ``(q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv], kv_cache, meta) -> [T, H, Dv]``.

Without CUDA (or ``use_graphs=False``) ``run`` executes the same segments eagerly through the same static buffers,
which is how the cut points and padding are tested on CPU.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from torchinferno.kernels.cuda_graphs import Bucketed, backend_supports_graphs, fresh_prompt_meta, sorted_buckets
from torchinferno.models.common.attention_metadata import AttentionMetadata

__all__ = ["DEFAULT_PIECEWISE_BUCKETS", "PiecewiseGraphRunner", "piecewise_buckets", "supports_piecewise_graphs"]

DEFAULT_PIECEWISE_BUCKETS = (8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512)


def piecewise_buckets(max_tokens: int) -> tuple[int, ...]:
    """The default buckets below ``max_tokens``, then ``max_tokens`` itself; () for 0."""
    if max_tokens <= 0:
        return ()
    return tuple(b for b in DEFAULT_PIECEWISE_BUCKETS if b < max_tokens) + (max_tokens,)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention backends of ``model`` in call order (module registration order is the layer order)."""
    from torchinferno.models.common.attention import TorchAttention

    return [m for m in model.modules() if isinstance(m, TorchAttention)]


def supports_piecewise_graphs(model: nn.Module) -> bool:
    """Every attention module of ``model`` declares ``supports_piecewise_graphs`` (and there is at least one)."""
    return backend_supports_graphs(model, "supports_piecewise_graphs")


class _Segments:
    """One bucket: ``graphs[i]`` runs segment ``i``; attention ``i`` (``calls[i]``: module, KV cache) runs between
    ``graphs[i]`` and ``graphs[i + 1]``; ``hidden`` is the last segment's output ``[Tb, D]``."""

    def __init__(self):
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.calls: list[tuple[nn.Module, object]] = []
        self.hidden: torch.Tensor | None = None


class PiecewiseGraphRunner(Bucketed):
    """A forward of up to ``max_tokens`` rows as graphed segments around eager attention (module docstring).

    ``model``: a family model (``forward(ids, positions, kv_caches, meta) -> hidden [T, D]``); ``kv_caches``: the
    per-layer cache tuples the model writes (never reallocated after capture). ``run`` returns ``[n, D]`` hidden
    states, a view of a static buffer that the next ``run`` overwrites.
    """

    def __init__(self, model: nn.Module, kv_caches, block_size: int, buckets=DEFAULT_PIECEWISE_BUCKETS,
                 use_graphs: bool | None = None):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.buckets = sorted_buckets(buckets, "piecewise")
        self.attn = attention_modules(model)
        if not self.attn:
            raise ValueError("piecewise graphs need a model with attention modules (TorchAttention subclasses)")
        self.device = next(model.parameters()).device
        can = self.device.type == "cuda" and supports_piecewise_graphs(model)
        self.use_graphs = can if use_graphs is None else (use_graphs and can)
        tmax, dev = self.buckets[-1], self.device
        self.input_ids = torch.zeros(tmax, dtype=torch.long, device=dev)
        self.positions = torch.zeros(tmax, dtype=torch.long, device=dev)
        self.q = self.k = self.v = self.o = None  # sized by the first forward (head counts are the model's)
        self.segments: dict[int, _Segments] = {}
        self.num_replays = 0
        self.num_eager = 0

    # ------------------------------------------------------------------ the cut points
    def _static(self, q, k, v) -> None:
        if self.q is None:
            tmax = self.max_tokens
            self.q = q.new_zeros((tmax, *q.shape[1:]))
            self.k = k.new_zeros((tmax, *k.shape[1:]))
            self.v = v.new_zeros((tmax, *v.shape[1:]))
            self.o = q.new_zeros((tmax, q.shape[1], v.shape[2]))

    def _segment_forward(self, T: int, meta: AttentionMetadata, on_cut) -> torch.Tensor:
        """The model's forward over rows ``[:T]`` of the static inputs with every attention call replaced by:
        copy q/k/v into the static buffers (still inside the current segment), ``on_cut(module, kv_cache)``
        (which ends a segment, runs attention into ``o[:T]`` and starts the next), return ``o[:T]``."""
        def cut_point(mod, q, k, v, kv_cache, _meta):  # stands in for ``mod.forward``
            self._static(q, k, v)
            self.q[:T].copy_(q)
            self.k[:T].copy_(k)
            self.v[:T].copy_(v)
            on_cut(mod, kv_cache)
            return self.o[:T]

        # An instance attribute shadows the class's ``forward`` for this call only (removed in ``finally``).
        for m in self.attn:
            m.forward = functools.partial(cut_point, m)
        try:
            return self.model(self.input_ids[:T], self.positions[:T], self.kv_caches, meta)  # [T, D]
        finally:
            for m in self.attn:
                del m.forward

    def _attend(self, mod: nn.Module, kv_cache, n: int, meta: AttentionMetadata) -> None:
        """Attention ``mod`` on live rows ``[:n]`` of the static q/k/v with the step's metadata, into ``o[:n]``."""
        # the class's forward: inside ``_segment_forward`` the instance's ``forward`` is the cut point itself
        self.o[:n].copy_(type(mod).forward(mod, self.q[:n], self.k[:n], self.v[:n], kv_cache, meta))

    def _capture_meta(self, T: int) -> AttentionMetadata:
        """A fresh prompt of ``T`` tokens whose KV goes nowhere (slot -1): what attention runs on while capturing."""
        return fresh_prompt_meta(T, torch.full((T,), -1, dtype=torch.long, device=self.device), self.block_size)

    # ------------------------------------------------------------------ capture / run
    @torch.inference_mode()
    def capture(self, warmup: int = 2) -> None:
        """Capture every bucket (largest first; one graph pool for all). No-op without graphs.

        Raises ``RuntimeError`` when a segment cannot be captured (e.g. an op that syncs with the host); the
        runner then holds no graphs and ``run`` stays eager."""
        if not self.use_graphs:
            return
        dev = self.device
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        pool = g = None
        try:
            with torch.cuda.stream(stream):
                for T in sorted(self.buckets, reverse=True):
                    meta = self._capture_meta(T)
                    for _ in range(warmup):  # kernel compiles and allocator settling, on the capture stream
                        self._segment_forward(T, meta, lambda mod, kv, T=T, meta=meta: self._attend(mod, kv, T, meta))
                    torch.cuda.synchronize(dev)
                    seg = _Segments()
                    g = torch.cuda.CUDAGraph()
                    g.capture_begin(pool=pool)

                    def cut(mod, kv, T=T, meta=meta, seg=seg):
                        nonlocal g, pool
                        g.capture_end()
                        pool = g.pool() if pool is None else pool
                        seg.graphs.append(g)
                        seg.calls.append((mod, kv))
                        self._attend(mod, kv, T, meta)  # eager, between segments (not captured)
                        g = torch.cuda.CUDAGraph()
                        g.capture_begin(pool=pool)

                    seg.hidden = self._segment_forward(T, meta, cut)
                    g.capture_end()
                    seg.graphs.append(g)
                    self.segments[T] = seg
            torch.cuda.synchronize(dev)
        except BaseException:
            self.segments.clear()
            if g is not None:  # a segment failed mid-capture: end that capture so the stream is usable again
                with torch.cuda.stream(stream):
                    if torch.cuda.is_current_stream_capturing():
                        try:
                            g.capture_end()
                        except RuntimeError:  # an invalidated capture ends with an error of its own; ours is the cause
                            pass
            raise
        finally:
            torch.cuda.current_stream(dev).wait_stream(stream)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states ``[n, D]`` of one step's ``n`` tokens (``1 <= n <= max_tokens``; ``input_ids`` /
        ``positions`` ``[n]`` on the device, ``meta`` the step's attention metadata for exactly those rows)."""
        n = input_ids.shape[0]
        T = self.step_bucket(n, "piecewise")
        torch._foreach_copy_([self.input_ids[:n], self.positions[:n]], [input_ids, positions], non_blocking=True)
        seg = self.segments.get(T)
        if seg is None:  # no graphs: the same segments and buffers, eagerly
            self.num_eager += 1
            return self._segment_forward(T, meta, lambda mod, kv: self._attend(mod, kv, n, meta))[:n]
        graphs, calls = seg.graphs, seg.calls
        for i, (mod, kv) in enumerate(calls):
            graphs[i].replay()
            self._attend(mod, kv, n, meta)
        graphs[-1].replay()
        self.num_replays += 1
        return seg.hidden[:n]
