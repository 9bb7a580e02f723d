"""Kernel launches of one decode step, counted per decoder layer (issue 24: the batch-1 DeepSeek step is bound by
launch count, not bytes).

Two counters with one report shape (``{layer name: Counter(op -> launches)}``, ops outside any decoder layer under
``"other"``):

* :func:`count_dispatch` (any device, a proxy): every aten op that reaches a kernel (a
  ``TorchDispatchMode``; views, allocations and other metadata-only ops are not counted) plus every Triton kernel
  launch (``JITFunction.run`` / the interpreter's ``InterpretedFunction.run``, named ``triton:<kernel>``; the aten
  ops a launch runs internally under Triton's CPU interpreter are not counted). On CPU with ``TRITON_INTERPRET=1``
  and Triton dispatch allowed on CPU tensors (tests/kernels/triton_interpreter_checks.py) it counts the CUDA
  path's launches without a GPU.
* :func:`count_cuda_kernels` (CUDA): the device kernels ``torch.profiler`` records, attributed to the decoder layer
  whose forward was running when the kernel was issued (``record_function`` ranges around each layer).

A layer's launches are the same for every MoE layer of a model; :func:`decode_step_launches` runs one decode step
of ``B`` sequences (context ``ctx``) through a model on the family contract and returns the report.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_NO_KERNEL = {  # ops that allocate or only change metadata (their .is_view is False)
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh", "detach", "alias",
    "_unsafe_view", "view", "reshape", "unsqueeze", "squeeze", "expand", "t", "transpose", "permute", "as_strided",
    "slice", "select", "split", "split_with_sizes", "unbind", "narrow", "chunk", "unflatten", "view_as",
    "set_", "resize_", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "is_same_size", "dim",
}


class _Counting:
    def __init__(self):
        self.layer = "other"
        self.counts: dict[str, Counter] = {}
        self.in_triton = 0

    def add(self, op: str) -> None:
        self.counts.setdefault(self.layer, Counter())[op] += 1


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, state: _Counting):
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.state.in_triton and not func.is_view and name not in _NO_KERNEL:
            self.state.add(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _triton_launches(state: _Counting):
    """Counts Triton launches while patched (both the compiled and the interpreted launcher)."""
    try:
        from triton.runtime import interpreter as interp
        from triton.runtime import jit
    except ImportError:
        yield
        return
    classes = [c for c in (jit.JITFunction, getattr(interp, "InterpretedFunction", None)) if c is not None]
    saved = [(c, c.run) for c in classes]

    def wrap(orig):
        def run(self, *args, **kwargs):
            state.add(f"triton:{getattr(self, '__name__', None) or getattr(self.fn, '__name__', '?')}")
            state.in_triton += 1
            try:
                return orig(self, *args, **kwargs)
            finally:
                state.in_triton -= 1

        return run

    for c, orig in saved:
        c.run = wrap(orig)
    try:
        yield
    finally:
        for c, orig in saved:
            c.run = orig


def _layer_hooks(model: torch.nn.Module, on_enter, on_exit) -> list:
    layers = _decoder_layers(model)
    handles = []
    for name, m in layers:
        handles.append(m.register_forward_pre_hook(lambda _m, _a, name=name: on_enter(name)))
        handles.append(m.register_forward_hook(lambda _m, _a, _o, name=name: on_exit(name)))
    return handles


def _decoder_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    stack = getattr(getattr(model, "model", model), "layers", None)
    if stack is None:
        raise ValueError("launch count: the model has no .model.layers (not on the family contract)")
    return [(f"layer{i}", m) for i, m in enumerate(stack)]


def count_dispatch(model: torch.nn.Module, fn) -> dict[str, Counter]:
    """Runs ``fn()`` once; aten kernels + Triton launches per decoder layer of ``model`` (see the module doc)."""
    state = _Counting()

    def enter(name):
        state.layer = name

    def leave(_name):
        state.layer = "other"

    handles = _layer_hooks(model, enter, leave)
    try:
        with _triton_launches(state), _DispatchCounter(state), torch.no_grad():
            fn()
    finally:
        for h in handles:
            h.remove()
    return state.counts


_LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync",
                "cudaMemsetAsync")


def count_cuda_kernels(model: torch.nn.Module, fn) -> dict[str, Counter]:
    """Runs ``fn()`` once under ``torch.profiler``: per decoder layer, the launch API calls (kernel launches,
    async copies / memsets) issued inside its forward (``record_function`` ranges); under ``"kernels"`` every
    device kernel of the step by name."""
    from torch.profiler import ProfilerActivity, profile, record_function

    ranges: dict[str, object] = {}

    def enter(name):
        ranges[name] = record_function(f"launch_count::{name}")
        ranges[name].__enter__()

    def leave(name):
        ranges.pop(name).__exit__(None, None, None)

    handles = _layer_hooks(model, enter, leave)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, torch.no_grad():
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    events = prof.events()
    spans = [(e.name.split("::", 1)[1], e.time_range.start, e.time_range.end) for e in events
             if e.name.startswith("launch_count::")]
    counts: dict[str, Counter] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            counts.setdefault("kernels", Counter())[e.name[:90]] += 1
        elif e.name in _LAUNCH_APIS:
            t = e.time_range.start
            layer = next((n for n, a, b in spans if a <= t <= b), "other")
            counts.setdefault(layer, Counter())[e.name] += 1
    return counts


def decode_inputs(model: torch.nn.Module, batch: int, ctx: int, block_size: int = 16, dtype=None):
    """(ids [B], positions [B], caches, meta) of one decode step of ``batch`` sequences with ``ctx`` cached tokens
    each (random cache contents) on the model's device."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    p = next(model.parameters())
    dev, dtype = p.device, dtype or p.dtype
    spec = model.family.kv_spec(model.config)
    per = -(-(ctx + 1) // block_size)
    caches = spec.allocate(batch * per + 1, block_size, dtype, dev)
    for layer in caches:
        for t in layer:
            t.normal_(generator=torch.Generator(device=dev).manual_seed(0))
    table = [list(range(1 + b * per, 1 + (b + 1) * per)) for b in range(batch)]
    meta = build_attention_metadata([1] * batch, [ctx] * batch, table, block_size, device=dev)
    ids = torch.arange(batch, device=dev) % model.config.vocab_size
    pos = torch.full((batch,), ctx, device=dev)
    return ids, pos, caches, meta


def decode_step_launches(model: torch.nn.Module, batch: int = 1, ctx: int = 32, cuda_profiler: bool = False,
                         head: bool = True) -> dict[str, Counter]:
    """Launches of one decode step (model forward + the LM head when ``head``), per decoder layer. The step runs
    once before counting (kernel compiles, lazy tables)."""
    ids, pos, caches, meta = decode_inputs(model, batch, ctx)

    def step():
        with torch.no_grad():
            h = model(ids, pos, caches, meta)
            return model.compute_logits(h) if head else h

    step()
    return (count_cuda_kernels if cuda_profiler else count_dispatch)(model, step)


def summary(counts: dict[str, Counter]) -> dict:
    """{"total": n, "per_layer": {layer: n}, "ops": {layer: {op: n}}} (JSON-ready)."""
    per = {k: sum(v.values()) for k, v in counts.items()}
    return {"total": sum(per.values()), "per_layer": per, "ops": {k: dict(v.most_common()) for k, v in counts.items()}}
