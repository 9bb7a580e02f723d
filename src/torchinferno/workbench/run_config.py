"""``RunConfig``: everything needed to rebuild a profiled run bit-for-bit (``run_config.json``).

Invariant: ``build_model(cfg)`` and ``make_prompts(cfg, vocab)`` are deterministic functions of
the config (tiny random models come from ``torchinferno.testing.tiny_model(kind, seed=...)``;
checkpoints from ``load_model_auto``), so every later command (``profile-subgraph``,
``profile-region``, ``profile-pattern``, ``repro.py``) reconstructs the same model and inputs.
Generation is greedy with ``ignore_eos``: exactly ``new_tokens`` tokens per row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from torchinferno.errors import ConfigError

CACHE_BACKENDS = ("dense", "paged")
PAGED_BLOCK_SIZE = 16


@dataclass
class RunConfig:
    model_kind: str | None = None  # family name -> tiny random model of ``size``
    model: str | None = None  # checkpoint: registry name, HF dir, .gguf, hub id
    size: str = "debug"
    variant: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 1
    prompt_tokens: int = 8
    new_tokens: int = 8
    cache_backend: str = "dense"
    seed: int = 0

    def validate(self) -> "RunConfig":
        if (self.model_kind is None) == (self.model is None):
            raise ConfigError("give exactly one of --model-kind (tiny random model of a family) or --model (checkpoint)")
        if self.cache_backend not in CACHE_BACKENDS:
            raise ConfigError(f"unknown cache backend '{self.cache_backend}' (valid: {', '.join(CACHE_BACKENDS)})")
        for name in ("batch_size", "prompt_tokens", "new_tokens"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        from torchinferno.checkpoint.auto import resolve_dtype

        resolve_dtype(self.dtype)
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"unknown device '{self.device}' (valid: cpu, cuda, cuda:N)")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"--device {self.device} requested but CUDA is not available (valid here: cpu)")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "RunConfig":
        known = {f.name for f in fields(RunConfig)}
        return RunConfig(**{k: v for k, v in d.items() if k in known})

    @staticmethod
    def from_args(a) -> "RunConfig":
        return RunConfig(
            model_kind=getattr(a, "model_kind", None), model=getattr(a, "model", None), size=getattr(a, "size", "debug"),
            variant=getattr(a, "variant", None), device=a.device, dtype=a.dtype, batch_size=a.batch_size,
            prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens, cache_backend=getattr(a, "cache_backend", "dense"),
            seed=a.seed,
        ).validate()

    @property
    def family_name(self) -> str | None:
        return self.model_kind


def build_model(cfg: RunConfig) -> nn.Module:
    """The run's model, in eval mode, with ``.family`` set."""
    from torchinferno.checkpoint.auto import load_model_auto, resolve_dtype

    if cfg.model_kind is not None:
        from torchinferno.testing import tiny_model

        return tiny_model(cfg.model_kind, size=cfg.size, seed=cfg.seed, dtype=resolve_dtype(cfg.dtype),
                          variant=cfg.variant, device=cfg.device)
    return load_model_auto(cfg.model, device=cfg.device, dtype=cfg.dtype, variant=cfg.variant)


def make_prompts(cfg: RunConfig, vocab_size: int) -> list[list[int]]:
    """``batch_size`` rows of ``prompt_tokens`` ids drawn from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(cfg.seed)
    return torch.randint(0, vocab_size, (cfg.batch_size, cfg.prompt_tokens), generator=g).tolist()


def generate_tokens(model: nn.Module, prompts: list[list[int]], cfg: RunConfig) -> list[list[int]]:
    """Greedy, ``ignore_eos``, ``new_tokens`` per row; dense = StaticGenerator, paged = the serving engine."""
    from torchinferno.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=cfg.new_tokens, temperature=0.0, ignore_eos=True)
    if cfg.cache_backend == "dense":
        from torchinferno.engine.generate import StaticGenerator

        gen = StaticGenerator(model, len(prompts), cfg.prompt_tokens + cfg.new_tokens)
        return [r.token_ids for r in gen.generate(prompts, params)]
    from torchinferno.engine.llm import LLM

    llm = LLM(model, block_size=PAGED_BLOCK_SIZE, max_num_seqs=len(prompts),
              max_model_len=cfg.prompt_tokens + cfg.new_tokens, enable_prefix_caching=False)
    return [o.token_ids for o in llm.generate(prompts, params)]
