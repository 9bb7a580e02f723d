"""``profile-offload``: run a model whose decoder layers live in host memory, staged to the device per use.

``LayerOffloader.attach(model, device)`` keeps the embedding, final norm, head and rope tables resident on
the device and every decoder layer's weights in host memory (pinned on CUDA). Forward hooks on each layer:

* before layer i runs: wait for its weights (staged ahead of time on a side stream), then start staging
  layer i+1 (the next step's layer 0 after the last layer), so the copy overlaps layer i's compute;
* after layer i: drop its device copy; with ``activation_offload`` also move its output to host memory and
  back (what a model whose activations do not fit would pay).

The model's own forward is unchanged, so the output equals the resident model's (tested), and decode uses
the KV cache on the device (prefill once, then one token per step). Movement and compute are timed
separately: CUDA events on the copy stream and the compute stream, wall time on CPU (there "staging" is a
real memory copy in host memory, so the loop runs anywhere). Each event is recorded for
``offload_events.json``; ``offload_summary.json`` gives totals, bytes, GB/s and how much of the movement
was hidden behind compute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["LayerOffloader", "OffloadEvent", "profile_offload"]


@dataclass
class OffloadEvent:
    kind: str  # "stage" | "compute" | "activation"
    layer: int
    start_us: float
    end_us: float
    bytes: int = 0


@dataclass
class _Layer:
    module: nn.Module
    host: dict[str, torch.Tensor]  # parameter/buffer name -> host tensor (pinned on CUDA)
    nbytes: int
    staged: dict[str, torch.Tensor] | None = None  # device copies, while staged
    ready: object = None  # CUDA event recorded after the copy (None on CPU)
    marks: tuple = ()  # timing marks of the copy in flight


class LayerOffloader:
    """Weights of every decoder layer in host memory, staged to ``device`` one layer ahead (module docstring)."""

    def __init__(self, model: nn.Module, device: str, activation_offload: bool = False):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.activation_offload = activation_offload
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.layers: list[_Layer] = []
        self.events: list[OffloadEvent] = []
        self._t0 = time.perf_counter()
        self._pending: list[tuple] = []  # CUDA: (kind, layer, start event, end event, bytes) read at flush
        stack = model.model.layers
        for layer in stack:
            host = {n: self._to_host(t) for n, t in _tensors(layer)}
            self.layers.append(_Layer(layer, host, sum(t.numel() * t.element_size() for t in host.values())))
            for n, t in _tensors(layer):
                _set(layer, n, torch.empty(0, dtype=t.dtype, device=self.device))  # nothing resident
        for i, entry in enumerate(self.layers):
            entry.module.register_forward_pre_hook(self._before(i))
            entry.module.register_forward_hook(self._after(i))
        self._stage(0)

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to("cpu").clone()
        return t.pin_memory() if self.cuda else t

    def _now_us(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    # ------------------------------------------------------------------ staging
    def _stage(self, i: int) -> None:
        entry = self.layers[i % len(self.layers)]
        if entry.staged is not None:
            return
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))  # the previous use is done
            with torch.cuda.stream(self.copy_stream):
                start.record()
                entry.staged = {n: t.to(self.device, non_blocking=True) for n, t in entry.host.items()}
                end.record()
            entry.ready = end
            self._pending.append(("stage", i % len(self.layers), start, end, entry.nbytes))
        else:
            t = self._now_us()
            entry.staged = {n: h.clone() for n, h in entry.host.items()}
            self.events.append(OffloadEvent("stage", i % len(self.layers), t, self._now_us(), entry.nbytes))

    def _before(self, i: int):
        def hook(module, args):
            entry = self.layers[i]
            self._stage(i)  # no-op when staged ahead
            if entry.ready is not None:
                torch.cuda.current_stream(self.device).wait_event(entry.ready)
            for n, t in entry.staged.items():
                _set(module, n, t)
            self._stage(i + 1)  # the next layer's copy overlaps this layer's compute
            entry.marks = self._mark()
        return hook

    def _after(self, i: int):
        def hook(module, args, output):
            entry = self.layers[i]
            self._record("compute", i, entry.marks, 0)
            if self.cuda:  # the copies may be reused only after this layer's kernels ran
                for t in entry.staged.values():
                    t.record_stream(torch.cuda.current_stream(self.device))
            for n, t in entry.staged.items():
                _set(module, n, torch.empty(0, dtype=t.dtype, device=self.device))
            entry.staged, entry.ready = None, None
            if self.activation_offload:
                marks = self._mark()
                output = tuple(None if o is None else o.to("cpu").to(self.device) for o in output)
                self._record("activation", i, marks, sum(o.numel() * o.element_size() for o in output if o is not None) * 2)
            return output
        return hook

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return (e,)
        return (self._now_us(),)

    def _record(self, kind: str, layer: int, marks, nbytes: int) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((kind, layer, marks[0], end, nbytes))
        else:
            self.events.append(OffloadEvent(kind, layer, marks[0], self._now_us(), nbytes))

    def flush(self) -> list[OffloadEvent]:
        """Resolve CUDA timings (synchronizes) and return every event so far, ordered by start."""
        if self.cuda and self._pending:
            torch.cuda.synchronize(self.device)
            base = self._pending[0][2]
            for kind, layer, s, e, nbytes in self._pending:
                self.events.append(OffloadEvent(kind, layer, base.elapsed_time(s) * 1e3, base.elapsed_time(e) * 1e3, nbytes))
            self._pending.clear()
        return sorted(self.events, key=lambda ev: ev.start_us)

    def reset(self) -> None:
        self.flush()
        self.events.clear()


def _to_device(model: nn.Module, device, keep_layers: bool = False) -> nn.Module:
    """``model`` on ``device`` (its decoder layers left where they are with ``keep_layers``), rope tables rebuilt."""
    for name, mod in model.named_children():
        if name != "model":
            mod.to(device)
    for name, mod in model.model.named_children():
        if name != "layers" or not keep_layers:
            mod.to(device)
    if hasattr(model, "init_buffers"):
        model.init_buffers()
    return model


def _tensors(module: nn.Module):
    yield from module.named_parameters()
    yield from module.named_buffers()


def _set(module: nn.Module, name: str, value: torch.Tensor) -> None:
    *path, leaf = name.split(".")
    owner = module
    for p in path:
        owner = getattr(owner, p)
    if leaf in owner._parameters:
        owner._parameters[leaf].data = value
    else:
        owner._buffers[leaf] = value


def _summarize(events: list[OffloadEvent], wall_us: float, iters: int) -> dict:
    def total(kind):
        return sum(e.end_us - e.start_us for e in events if e.kind == kind)

    stage, compute, act = total("stage"), total("compute"), total("activation")
    moved = sum(e.bytes for e in events if e.kind == "stage")
    # Movement hidden behind compute: copy time that overlaps some compute interval.
    comp = sorted((e.start_us, e.end_us) for e in events if e.kind == "compute")
    hidden = 0.0
    for e in events:
        if e.kind != "stage":
            continue
        for s, t in comp:
            hidden += max(0.0, min(e.end_us, t) - max(e.start_us, s))
    return {
        "iters": iters, "wall_us_per_iter": wall_us / iters, "movement_us_per_iter": stage / iters,
        "compute_us_per_iter": compute / iters, "activation_movement_us_per_iter": act / iters,
        "bytes_staged_per_iter": moved // max(1, iters),
        "staging_gb_s": moved / (stage * 1e-6) / 1e9 if stage else None,
        "movement_hidden_fraction": hidden / stage if stage else None,
        "estimated_resident_us_per_iter": compute / iters,
    }


@dataclass
class OffloadConfig:
    warmup: int = 1
    iters: int = 3
    activation_offload: bool = False
    extra: dict = field(default_factory=dict)


def profile_offload(out_dir, run_cfg, ocfg: OffloadConfig) -> dict:
    """Resident reference, then the offloaded model (warm-up + timed iterations); writes the artifacts."""
    from torchinferno.workbench.artifacts import ArtifactDir
    from torchinferno.workbench.profiling import environment, memory_profile, model_bytes, reset_memory
    from torchinferno.workbench.repro_templates import call_repro
    from torchinferno.workbench.run_config import build_model, generate_tokens, make_prompts

    run_cfg.validate()
    out = ArtifactDir(out_dir, "profile-offload")
    out.json("run_config.json", {**run_cfg.to_dict(), "warmup": ocfg.warmup, "iters": ocfg.iters,
                                 "activation_offload": ocfg.activation_offload}, "the workload and the offload setup")
    out.json("environment.json", environment(), "python/torch/CUDA versions and devices")
    device = run_cfg.device
    host_cfg = type(run_cfg).from_dict({**run_cfg.to_dict(), "device": "cpu"})
    model = build_model(host_cfg)  # built in host memory, as a model too big for the device would be
    prompts = make_prompts(run_cfg, model.config.vocab_size)
    out.json("input_ids.json", {"input_ids": prompts, "seed": run_cfg.seed}, "prompt token ids, one row per sequence")
    weights = model_bytes(model)
    # The reference, fully resident: the same host build moved whole to the device. (Built on the device instead, a
    # random model draws other weights from the device's generator: session 22's CUDA run compared two models.)
    resident = _to_device(build_model(host_cfg), device)
    resident_tokens = generate_tokens(resident, prompts, run_cfg)
    del resident
    _to_device(model, device, keep_layers=True)  # everything but the decoder layers is resident on the device
    off = LayerOffloader(model, device, ocfg.activation_offload)
    for _ in range(ocfg.warmup):
        generate_tokens(model, prompts, run_cfg)
    off.reset()
    reset_memory(device)
    t0 = time.perf_counter()
    for _ in range(max(1, ocfg.iters)):
        tokens = generate_tokens(model, prompts, run_cfg)
    events = off.flush()
    wall_us = (time.perf_counter() - t0) * 1e6
    summary = _summarize(events, wall_us, max(1, ocfg.iters))
    summary.update(weight_bytes=weights, offloaded_layers=len(off.layers), match_resident=tokens == resident_tokens)
    out.json("output.json", {"token_ids": tokens, "resident_token_ids": resident_tokens,
                             "match_resident": tokens == resident_tokens}, "tokens of the offloaded and resident runs")
    out.json("offload_events.json", {"events": [e.__dict__ for e in events]},
             "every stage / compute / activation interval (us from the first event) with bytes moved")
    out.json("offload_summary.json", summary, "movement vs compute per iteration, bytes, GB/s, overlap")
    out.json("memory_profile.json", memory_profile(device, {"weight_bytes": weights}),
             "allocator statistics (CUDA) or RSS (CPU) during the offloaded runs")
    out.python("offload_repro.py", call_repro("profile-offload", "offload_repro.py", "torchinferno.workbench.offload",
                                              "rerun_offload", {"run_config": run_cfg.to_dict(), "expected": tokens,
                                                                "activation_offload": ocfg.activation_offload}),
               "standalone: reruns the offloaded generation and checks the tokens")
    return out.finish(match_resident=tokens == resident_tokens, offloaded_layers=len(off.layers),
                      movement_us_per_iter=round(summary["movement_us_per_iter"], 1),
                      compute_us_per_iter=round(summary["compute_us_per_iter"], 1))


def rerun_offload(run_config: dict, expected: list, activation_offload: bool = False) -> dict:
    """The repro's entry: offloaded generation again, compared with the recorded tokens."""
    from torchinferno.workbench.run_config import RunConfig, build_model, generate_tokens, make_prompts

    cfg = RunConfig.from_dict(run_config)
    model = _to_device(build_model(RunConfig.from_dict({**run_config, "device": "cpu"})), cfg.device, keep_layers=True)
    LayerOffloader(model, cfg.device, activation_offload)
    tokens = generate_tokens(model, make_prompts(cfg, model.config.vocab_size), cfg)
    return {"ok": tokens == expected, "match": tokens == expected}
