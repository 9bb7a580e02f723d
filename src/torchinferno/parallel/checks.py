"""Refusals of a tensor-parallel world a model cannot be split over, in one line each, before any work."""

from __future__ import annotations

from torchinferno.errors import ConfigError
from torchinferno.models.protocol import ModelFamily
from torchinferno.parallel.config import ParallelConfig


def check_split(family: ModelFamily, config, tp_size: int) -> None:
    """ConfigError naming the field (heads, KV heads, intermediate, experts) ``tp_size`` does not divide."""
    if tp_size == 1:
        return
    family.parallel_plan().check(config, ParallelConfig(tp_size=tp_size))


def parallel_world(config) -> tuple[int, str]:
    """``(ranks, mode)`` an engine config asks for: ``tensor_parallel_size`` or ``pipeline_parallel_size``."""
    pp = getattr(config, "pipeline_parallel_size", 1)
    return (pp, "pipeline") if pp > 1 else (config.tensor_parallel_size, "tensor")


def check_spec(spec, tp_size: int, mode: str = "tensor") -> None:
    """``check_world`` and ``check_split`` for an ``engine.assembly.ModelSpec`` (its config only: no weights)."""
    check_world(tp_size, spec.device)
    check_split_spec(spec, tp_size, mode)


def check_split_spec(spec, tp_size: int, mode: str = "tensor") -> None:
    """``check_split`` (pipeline: at least one layer per stage) for a ``ModelSpec`` (reads only its config)."""
    if tp_size == 1:
        return
    from torchinferno.models.registry import family_for_hf_config, get_family

    if spec.model_kind is not None:
        family = get_family(spec.model_kind)
        config = family.size(spec.size)
    else:
        from torchinferno.checkpoint.safetensors_io import read_config

        hf = read_config(spec.checkpoint_dir())
        family = family_for_hf_config(hf)
        config = family.config_from_hf(hf)
    if mode == "pipeline":
        from torchinferno.parallel.pipeline import stage_range

        stage_range(config.num_hidden_layers, tp_size, 0)
        return
    check_split(family, config, tp_size)


def check_world(tp_size: int, device: str) -> None:
    """Enough devices for ``tp_size`` CUDA ranks (CPU ranks are processes: any number)."""
    if tp_size < 1:
        raise ConfigError(f"--tensor-parallel-size must be >= 1 (got {tp_size})")
    if device.startswith("cuda") and tp_size > 1:
        import torch

        have = torch.cuda.device_count()
        if have < tp_size:
            raise ConfigError(f"--tensor-parallel-size {tp_size} needs {tp_size} CUDA devices (this host has {have})")


# ------------------------------------------------------------------ TP == TP=1 (tests, validate-model-variants)

PROMPT = [5, 17, 99, 3, 250, 42, 7, 128, 64, 11, 200]


def rank_outputs(comm, kind: str, size: str = "debug", seed: int = 0, variant: str | None = None,
                 new_tokens: int = 6, device: str = "cpu") -> dict:
    """On one rank of a world: the tiny random ``kind`` model's prompt logits, greedy tokens and seeded
    temperature-sampled tokens (``generate``: static KV cache, prefill then decode)."""

    from torchinferno.engine.assembly import ModelSpec
    from torchinferno.parallel.load import build_rank_model

    spec = ModelSpec(model_kind=kind, size=size, seed=seed, dtype="float32", prepack=False, variant=variant,
                     device=device)
    model = build_rank_model(spec, comm) if comm is not None else _single(spec)
    return outputs_of(model, new_tokens)


def _single(spec):
    from torchinferno.engine.assembly import build_model

    return build_model(spec)


def outputs_of(model, new_tokens: int = 6) -> dict:
    import torch

    dev = next(model.parameters()).device
    prompt = torch.tensor(PROMPT, device=dev)
    with torch.no_grad():
        logits = model.compute_logits(model(prompt, torch.arange(len(PROMPT), device=dev))).cpu()  # [T, V]
        greedy = model.generate(prompt[None], new_tokens, ignore_eos=True)[0, len(PROMPT):]
        sampled = model.generate(prompt[None], new_tokens, temperature=0.8, seed=3, ignore_eos=True)[0, len(PROMPT):]
    return {"logits": logits, "greedy": greedy.tolist(), "sampled": sampled.tolist()}


def _rank_outputs_each(comm, models: tuple[tuple[str, str | None], ...], size: str, device: str) -> list[dict]:
    return [rank_outputs(comm, kind, size, 0, variant, device=device) for kind, variant in models]


def tp_report(models: list[tuple[str, str | None]], tp: int, size: str = "debug", device: str = "cpu",
              mode: str = "tensor") -> list[dict]:
    """Each ``(family, variant)`` of the tiny ``size`` run on one world of ``tp`` spawned ranks (gloo on ``cpu``;
    NCCL on ``cuda``, rank r on cuda:r; ``mode`` tensor: layers split, pipeline: stages of layers) and on one
    device here. Per model: ``max_abs_err`` / ``rel_err`` (``max|TP - TP1| / max|TP1|``) of the prompt logits
    over every rank, and ``mismatch``: '' when greedy and seeded temperature tokens are equal on every rank."""
    from torchinferno.parallel.spawn import run_ranks

    models = tuple(models)
    refs = [rank_outputs(None, kind, size, variant=variant, device=device) for kind, variant in models]
    per_rank = run_ranks(_rank_outputs_each, tp, models, size, device,
                         backend="nccl" if device.startswith("cuda") else "gloo", mode=mode)
    report = []
    for i, ((kind, _), ref) in enumerate(zip(models, refs)):
        err, mismatch = 0.0, ""
        for rank, outs in enumerate(per_rank):
            out = outs[i]
            err = max(err, float((out["logits"] - ref["logits"]).abs().max()))
            for key in ("greedy", "sampled"):
                if out[key] != ref[key] and not mismatch:
                    mismatch = f"{kind} rank {rank}: {key} tokens {out[key]} != TP=1 {ref[key]}"
        report.append({"family": kind, "max_abs_err": err, "rel_err": err / float(ref["logits"].abs().max()),
                       "mismatch": mismatch})
    return report


def compare_tp(kinds: str | tuple[str, ...], tp: int, size: str = "debug", variant: str | None = None,
               atol: float = 1e-5, device: str = "cpu", mode: str = "tensor") -> str:
    """'' if every kind's TP=``tp`` logits agree with TP=1 within ``atol`` and its tokens are equal on every rank
    (:func:`tp_report`), else what differs."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    for row in tp_report([(k, variant) for k in kinds], tp, size, device, mode):
        if row["max_abs_err"] > atol:
            return f"{row['family']}: logits differ from TP=1 by {row['max_abs_err']:.3g} (> {atol:g})"
        if row["mismatch"]:
            return row["mismatch"]
    return ""
