"""Plain batched generation over a preallocated static KV cache.

The cache is allocated once per :class:`StaticGenerator` (``max_batch_size`` rows of
``max_seq_len`` tokens: the paged layout with one block per row) and reused across calls; no
per-step reallocation. Prompts of different lengths are prefilled together as one flattened
ragged batch; decode steps carry only rows that are still running. This is the reference path
the serving engine is checked against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.step_model import cpu_kv_cache_dtype, step_model


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    text: str | None = None
    stop_reason: int | str | None = None


@dataclass
class GenerationStats:
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def decode_tok_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


class _Row:
    """Per-row decoding state: token ids and the shared text/stop handling (``SequenceText``)."""

    def __init__(self, prompt: list[int], params: SamplingParams, tokenizer, eos_ids: set[int], device):
        from torchinferno.text.sampling import make_generator
        from torchinferno.text.sequence_text import SequenceText

        self.prompt = prompt
        self.params = params
        self.out: list[int] = []
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else eos_ids)
        self.generator = make_generator(params.seed, device) if params.seed is not None else None
        self.seq = SequenceText(tokenizer, params.stop)

    @property
    def finish(self) -> str | None:
        return self.seq.finish_reason

    def append(self, tok: int) -> None:
        self.out.append(tok)
        self.seq.add(tok, tok in self.stop_ids, len(self.out) >= self.params.max_tokens)


def _first_tensor(model: nn.Module) -> torch.Tensor:
    """A parameter (or, for fully packed models, a buffer): tells the device and dtype."""
    p = next(model.parameters(), None)
    return p if p is not None else next(b for b in model.buffers() if b.is_floating_point())


def _param_dtype(model: nn.Module) -> torch.dtype:
    return _first_tensor(model).dtype


class StaticGenerator:
    """Owns a static cache for ``max_batch_size`` x ``max_seq_len`` and generates with it."""

    def __init__(self, model: nn.Module, max_batch_size: int, max_seq_len: int, cache_dtype: torch.dtype | None = None):
        self.family = model.family
        self.device = _first_tensor(model).device
        # On CPU the family's lean decode step on pre-packed weights, when it has one (models/common/step_model).
        self.model = step_model(model, self.device) if self.device.type == "cpu" else model
        self.max_batch_size = max_batch_size
        self.max_seq_len = min(max_seq_len, model.config.max_position_embeddings)
        # CPU: fp32 for TorchAttention, or the activation dtype when the lean step reads the cache natively
        dtype = cache_dtype or (cpu_kv_cache_dtype(model) if self.device.type == "cpu" else _param_dtype(model))
        spec = self.family.kv_spec(model.config)
        self.kv_caches = spec.allocate(max_batch_size, self.max_seq_len, dtype, self.device)
        self.stats = GenerationStats()

    def _decode_meta(self, rows: torch.Tensor, positions: torch.Tensor, rows_list: list[int], pos_list: list[int]) -> AttentionMetadata:
        n = len(rows_list)
        return AttentionMetadata(
            query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=self.device),
            seq_lens=(positions + 1).to(torch.int32),
            slot_mapping=rows * self.max_seq_len + positions,
            block_tables=rows.view(-1, 1).to(torch.int32),
            block_size=self.max_seq_len,
            query_lens_list=[1] * n,
            seq_lens_list=[p + 1 for p in pos_list],
            block_tables_host=[[r] for r in rows_list],
        )

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], tokenizer=None, eos_token_ids=None) -> list[GenerationResult]:
        from torchinferno.errors import ConfigError
        from torchinferno.models.common.attention_metadata import (
            build_attention_metadata,
        )
        from torchinferno.text.sampling import sample

        B = len(prompts)
        plist = params if isinstance(params, list) else [params] * B
        if B > self.max_batch_size:
            raise ConfigError(f"{B} prompts exceed max_batch_size={self.max_batch_size}")
        for p, sp in zip(prompts, plist):
            sp.validate()
            if not p:
                raise ConfigError("empty prompt: at least one token is required")
            if len(p) + sp.max_tokens > self.max_seq_len:
                raise ConfigError(f"prompt ({len(p)} tokens) + max_tokens ({sp.max_tokens}) exceeds the context length {self.max_seq_len}")
        eos = set(eos_token_ids if eos_token_ids is not None else self.model.config.eos_token_ids)
        if tokenizer is not None and eos_token_ids is None:
            eos |= set(tokenizer.eos_token_ids)
        rows = [_Row(p, sp, tokenizer, eos, self.device) for p, sp in zip(prompts, plist)]
        stats = self.stats = GenerationStats()
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

        # Prefill: every prompt in one flattened ragged forward; row b uses cache row b.
        t0 = time.perf_counter()
        lens = [len(p) for p in prompts]
        meta = build_attention_metadata(lens, [0] * B, [[b] for b in range(B)], self.max_seq_len, self.device)
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        hidden = self.model(ids, pos, self.kv_caches, meta)
        logits = self.model.compute_logits(hidden[meta.last_token_indices()])
        toks = sample(logits, [r.params for r in rows], [r.generator for r in rows]).tolist()
        for r, t in zip(rows, toks):
            r.append(t)
        sync()
        stats.prefill_s = time.perf_counter() - t0

        # Decode: only running rows; their cache row index stays fixed.
        t0 = time.perf_counter()
        while True:
            live = [b for b, r in enumerate(rows) if r.finish is None]
            if not live:
                break
            pos_list = [len(rows[b].prompt) + len(rows[b].out) - 1 for b in live]
            rows_t = torch.tensor(live, dtype=torch.long, device=self.device)
            pos_t = torch.tensor(pos_list, dtype=torch.long, device=self.device)
            ids = torch.tensor([rows[b].out[-1] for b in live], dtype=torch.long, device=self.device)
            meta = self._decode_meta(rows_t, pos_t, live, pos_list)
            logits = self.model.compute_logits(self.model(ids, pos_t, self.kv_caches, meta))
            toks = sample(logits, [rows[b].params for b in live], [rows[b].generator for b in live]).tolist()
            for b, t in zip(live, toks):
                rows[b].append(t)
            stats.decode_steps += 1
            stats.decode_tokens += len(live)
        sync()
        stats.decode_s = time.perf_counter() - t0
        return [
            GenerationResult(r.prompt, r.out, r.finish or "length", r.seq.text if tokenizer is not None else None,
                             r.seq.stop_reason)
            for r in rows
        ]


def generate(model: nn.Module, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], tokenizer=None) -> list[GenerationResult]:
    """One-shot convenience wrapper: allocates a cache sized for this call."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    need = max(len(p) + sp.max_tokens for p, sp in zip(prompts, plist))
    return StaticGenerator(model, len(prompts), need).generate(prompts, params, tokenizer)
