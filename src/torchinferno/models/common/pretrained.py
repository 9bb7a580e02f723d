"""The Hugging Face-style user API every family model inherits (through ``CausalLMBase``).

``family`` (from the class, via the registry), ``generate(prompt [B, T]) -> [B, T + N]``,
``save_pretrained(dir)`` and ``Class.from_pretrained(dir_or_hub_id)``. Generation is
``engine.generate.StaticGenerator`` (static KV cache); checkpoint IO is ``checkpoint.auto``. Both
are imported when called, so building a model imports neither (and no import cycle forms).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from torchinferno.errors import ConfigError
from torchinferno.models.protocol import ModelFamily


class PretrainedMixin:
    """Mixed into ``CausalLMBase``. A family's model class sets ``family_name`` (its registry name);
    subclasses (variants, promoted classes) inherit it."""

    family_name: ClassVar[str | None] = None

    # ------------------------------------------------------------------ family
    @property
    def family(self) -> ModelFamily | None:
        """The ``ModelFamily`` of this model: the one assigned (loaders set it), else the registry's entry
        for the class's ``family_name``; None for a class outside the registry."""
        fam = self.__dict__.get("_family")
        if fam is not None:
            return fam
        if self.family_name is None:
            return None
        from torchinferno.models.registry import get_family

        return get_family(self.family_name)

    @family.setter
    def family(self, value: ModelFamily | None) -> None:
        self.__dict__["_family"] = value

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompt: torch.Tensor | list,
        max_new_tokens: int = 16,
        *,
        temperature: float = 0.0,
        top_k: int = -1,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: int | None = None,
        ignore_eos: bool = False,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
    ) -> torch.Tensor:
        """``prompt [B, T]`` token ids -> ``[B, T + max_new_tokens]`` (prompt, then the new tokens).

        Greedy by default (``temperature=0``); otherwise temperature / top-k / top-p / min-p sampling
        as ``SamplingParams`` defines them. ``seed``: row ``b`` draws from its own generator seeded
        with ``seed + b`` (reproducible; identical prompts in one batch still sample independently);
        None uses the global torch RNG. Every row is a full prompt (no attention mask / left padding).

        EOS: a row stops at the first of ``eos_token_id`` (default: the config's ids) unless
        ``ignore_eos``; the EOS token is kept and the rest of the row is filled with
        ``pad_token_id`` (default: the config's, else that EOS id), so the shape is always
        ``[B, T + max_new_tokens]``. A 1-D prompt ``[T]`` is one row and returns ``[T + max_new_tokens]``.
        Runs on the model's device with a static KV cache sized for this call (``StaticGenerator``);
        the result is on the prompt's device.
        """
        from torchinferno.core.sampling_params import SamplingParams
        from torchinferno.engine.generate import StaticGenerator

        ids = _as_prompt(prompt, self.config.vocab_size)  # [B, T] int64
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        squeeze = ids.dim() == 1
        ids2 = ids.view(1, -1) if squeeze else ids
        if max_new_tokens == 0:
            return ids.clone()
        if self.family is None:
            raise ConfigError(f"{type(self).__name__} has no model family (set family_name or .family) to size its KV cache")
        eos = self.config.eos_token_ids if eos_token_id is None else _id_list(eos_token_id)
        rows = ids2.tolist()
        params = [
            SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           seed=None if seed is None else seed + b, ignore_eos=ignore_eos)
            for b in range(len(rows))
        ]
        gen = StaticGenerator(self, len(rows), ids2.shape[1] + max_new_tokens)
        results = gen.generate(rows, params, eos_token_ids=eos)
        pad = pad_token_id if pad_token_id is not None else self.config.pad_token_id
        out = torch.empty(ids2.shape[0], max_new_tokens, dtype=torch.long)
        for b, r in enumerate(results):
            fill = pad if pad is not None else r.token_ids[-1]  # the EOS id the row stopped at
            out[b] = torch.tensor(r.token_ids + [fill] * (max_new_tokens - len(r.token_ids)), dtype=torch.long)
        full = torch.cat([ids2.cpu(), out], dim=1).to(ids.device)
        return full[0] if squeeze else full

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(self, save_directory: str | Path, max_shard_bytes: int = 2 * 1024**3) -> Path:
        """Write config.json + safetensors in the HF layout of this model's family (``checkpoint.auto``)."""
        from torchinferno.checkpoint.auto import save_pretrained

        return save_pretrained(self, save_directory, max_shard_bytes=max_shard_bytes)

    @classmethod
    def from_pretrained(cls, model: str | Path, device: str | torch.device = "cpu",
                        dtype: str | torch.dtype | None = None, cache_dir: str | Path | None = None, **model_kwargs: Any):
        """An instance of exactly ``cls`` loaded from a checkpoint dir or hub id (``checkpoint.auto.load_model_class``).

        Refuses (ConfigError, one line) a checkpoint of another family. ``dtype`` None: float32.
        ``model_kwargs`` go to ``cls(config, **model_kwargs)`` (e.g. ``attention_backend``).
        """
        from torchinferno.checkpoint.auto import load_model_class

        return load_model_class(cls, model, device=device, dtype=dtype, cache_dir=cache_dir, **model_kwargs)


def _id_list(ids: int | list[int]) -> list[int]:
    return [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]


def _as_prompt(prompt: torch.Tensor | list, vocab_size: int) -> torch.Tensor:
    """``[T]`` or ``[B, T]`` int64 prompt ids, checked (ConfigError on a bad shape, dtype or id)."""
    if not isinstance(prompt, torch.Tensor):
        try:
            prompt = torch.tensor(prompt, dtype=torch.long)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"prompt must be a [B, T] tensor of token ids (or nested lists of ints): {e}") from None
    if prompt.dtype == torch.bool or prompt.is_floating_point() or prompt.is_complex():
        raise ConfigError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    if prompt.dim() not in (1, 2) or prompt.numel() == 0:
        raise ConfigError(f"prompt must be a non-empty [B, T] (or [T]) tensor, got shape {tuple(prompt.shape)}")
    prompt = prompt.long()
    lo, hi = int(prompt.min()), int(prompt.max())
    if lo < 0 or hi >= vocab_size:
        raise ConfigError(f"prompt token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab_size})")
    return prompt
