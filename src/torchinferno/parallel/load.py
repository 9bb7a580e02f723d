"""Build one rank of a tensor-parallel model: ``meta`` build -> family plan -> materialize -> its shards.

Each rank reads only its part of every tensor: from safetensors through lazy slices (``get_slice``: peak
host memory ~ model / N + one tensor), or from an in-memory full model (tiny random models of tests).
Invariant: the returned model's logits (``compute_logits`` after ``forward``) equal the unsharded
model's on every rank, up to the reduction order of the all-reduces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from torchinferno.errors import CheckpointError
from torchinferno.models.common.module_utils import materialize
from torchinferno.models.protocol import ModelFamily
from torchinferno.parallel.comm import Comm
from torchinferno.parallel.plan import ShardRule

Rule = Callable[[str], ShardRule]


def shard_tensors(tensors: Iterable[tuple[str, torch.Tensor]], rule: Rule) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's ``(name, part)`` of full in-memory tensors."""
    for name, t in tensors:
        r = rule(name)
        if not r.skip:
            yield r.rename or name, r.read(t)


def shard_checkpoint(ckpt_dir: str | Path, rule: Rule) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's ``(name, part)`` of every tensor of an HF safetensors directory, reading only the part."""
    from safetensors import safe_open

    from torchinferno.checkpoint.safetensors_io import tensor_index

    plan: dict[str, list[str]] = {}
    for name, info in tensor_index(ckpt_dir).items():
        plan.setdefault(info.file, []).append(name)
    for file, names in plan.items():
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in names:
                r = rule(name)
                if r.skip:
                    continue
                try:
                    part = r.read(f.get_slice(name))
                except Exception as e:  # noqa: BLE001  (safetensors raises its own error types)
                    raise CheckpointError(f"cannot read tensor '{name}' from {file}: {str(e).splitlines()[0]}") from None
                yield r.rename or name, part


def build_rank(family: ModelFamily, config, comm: Comm, tensors: Callable[[Rule], Iterable[tuple[str, torch.Tensor]]],
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, variant: str | None = None,
               attention_backend: type[nn.Module] | None = None) -> nn.Module:
    """Rank ``comm.rank`` of ``family``'s model of ``config``; ``tensors(rule)`` yields the rank's HF tensors."""
    pcfg = comm.pcfg
    kw = {} if variant is None else {"variant": variant}
    if attention_backend is not None:
        kw["attention_backend"] = attention_backend
    if pcfg.mode == "pipeline":
        from torchinferno.parallel import pipeline

        model = family.build(config, device="meta", **kw)
        pipeline.shard_model(model, pcfg.tp_size, pcfg.rank)

        def rule(name: str) -> ShardRule:
            return pipeline.tensor_rule(name, config, pcfg.tp_size, pcfg.rank)
    else:
        pm = family.parallel_plan()
        pm.check(config, pcfg)
        model = family.build(config, device="meta", **kw)
        pm.shard_model(model, pcfg, comm)

        def rule(name: str) -> ShardRule:
            return pm.tensor_rule(name, config, pcfg)
    materialize(model, device, dtype)
    family.load_weights(model, tensors(rule))
    model.eval()
    model.family = family
    model.parallel = comm.pcfg
    model.comm = comm
    return model


def _rank_device(device: str, comm: Comm) -> str:
    """CUDA ranks run one per device (rank r on cuda:r, made current; or on the r-th entry of a comma list such as
    ``cuda:4,cuda:5``: a disaggregated role's devices); CPU ranks share the host."""
    if "," in device:
        devices = device.split(",")
        if len(devices) != comm.world_size:
            from torchinferno.errors import ConfigError

            raise ConfigError(f"device list {device!r} has {len(devices)} entries for {comm.world_size} ranks")
        device = devices[comm.rank]
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        return device
    if device.startswith("cuda") and comm.world_size > 1:
        device = f"cuda:{comm.rank}"
        torch.cuda.set_device(device)
    return device


def build_rank_model(spec, comm: Comm) -> nn.Module:
    """Rank ``comm.rank`` of an ``engine.assembly.ModelSpec``: a checkpoint (each rank reads its slices) or a
    tiny random model of a family (built whole on CPU with the spec's seed, then sliced: the same weights
    as the single-device model of that spec)."""
    from torchinferno.checkpoint.auto import default_attention_backend, resolve_dtype
    from torchinferno.engine.assembly import check_device
    from torchinferno.models.registry import family_for_hf_config, get_family

    check_device(spec.device)
    dtype = resolve_dtype(spec.dtype)
    if spec.quantization != "none":
        from torchinferno.errors import ConfigError

        raise ConfigError(f"--quantization {spec.quantization} is not supported with --tensor-parallel-size > 1 yet")
    if spec.model_kind is not None:
        from torchinferno.testing import tiny_model

        family = get_family(spec.model_kind)
        config = family.size(spec.size)
        # drawn on the spec's device type, as the single-device model of this spec is (the RNG differs per type)
        full = tiny_model(spec.model_kind, size=spec.size, seed=spec.seed, dtype=dtype, variant=spec.variant,
                          device=_rank_device(spec.device, comm))

        def tensors(rule: Rule):
            return shard_tensors(family.export_weights(full), rule)
    else:
        from torchinferno.checkpoint.safetensors_io import read_config

        ckpt = spec.checkpoint_dir()
        family = family_for_hf_config(read_config(ckpt))
        config = family.config_from_hf(read_config(ckpt))

        def tensors(rule: Rule):
            return shard_checkpoint(ckpt, rule)
    device = _rank_device(spec.device, comm)
    backend = default_attention_backend(family, config, device)
    model = build_rank(family, config, comm, tensors, device, dtype, spec.variant, backend)
    if getattr(spec, "kernel_artifacts", None) is not None:  # each rank loads its local-heads shape (one notice each)
        from torchinferno.kernels import v4_artifacts

        v4_artifacts.apply(model, spec.kernel_artifacts)
    return model
