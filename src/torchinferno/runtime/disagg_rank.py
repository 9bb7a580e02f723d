"""One disaggregated rank (``runtime.disagg``): one model instance, a paged KV cache and its block pool, and the
prefill / decode / release methods behind the rank files' local RPC.

* ``prefill``: take the prompt's blocks (leading full blocks cached by earlier prompts are reused: the prefix cache
  of ``cache.block_pool``; only the rest is computed), run the prompt forward (the family's real forward over the
  paged layout), sample the first token, and return it with the prompt's live KV rows of every layer and KV kind
  (``disagg_wire``'s payload). The rank *holds* those blocks until ``release`` (or ``kv_ttl_s`` passes), so the
  driver can re-read them (``kv``) to retry on another decode rank; a driver whose decode rank fails releases them.
* ``decode``: check the payload against this rank's ``KVSpec`` and dtype, allocate blocks for prompt + new tokens,
  scatter the KV rows into them, decode token by token from the first token, free the blocks, return the tokens.

Invariants: every refusal (``RpcError``/``TorchInfernoError``) happens before any state changes (blocks allocated
are freed on any failure); methods are serialized by ``lock`` (one model, one cache); a seeded request continues
its prefill generator's exact state on the decode rank (``sampler.rng_state``), so seeded sampling equals a
colocated run too.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.errors import ConfigError
from torchinferno.runtime.disagg_wire import (
    RNG_STATE_KEY,
    RpcError,
    check_kv_payload,
    kv_payload_bytes,
    kv_tensor_names,
)

__all__ = ["SAMPLING_FIELDS", "DisaggRank", "RankConfig"]

ROLES = ("prefill", "decode")
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop_token_ids", "ignore_eos")
"""Sampling fields the RPC accepts (token ids only: no stop strings, logprobs or n)."""


@dataclass(frozen=True)
class RankConfig:
    """What a rank file configures. Exactly one of ``model`` (registry name / HF dir / .gguf) and ``model_kind``
    (a tiny random model of that family, size ``size``, seeded with ``seed``: identical on every rank) is set.
    ``kv_cache_dtype`` ``auto``: float32 on CPU (attention runs in fp32 there), the model's dtype on CUDA; or any
    ``--kv-cache-dtype`` spelling (``fp8``: the payload carries the stored FP8 bytes as they are)."""

    role: str
    rank: int
    port: int
    host: str = "127.0.0.1"
    device: str = "cpu"
    model: str | None = None
    model_kind: str | None = "llama3"
    size: str = "debug"
    seed: int = 0
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    num_blocks: int = 256
    kv_ttl_s: float = 60.0
    prefix_caching: bool = True  # a prefill rank reuses full blocks of earlier prompts (decode ranks never look up)
    max_body_bytes: int = 4 << 30  # a 70B bf16 prompt of 4096 tokens is ~1.3 GB of KV

    def validate(self) -> RankConfig:
        if self.role not in ROLES:
            raise ConfigError(f"role must be one of {', '.join(ROLES)}, got '{self.role}'")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"unknown DEVICE '{self.device}' (valid: cpu, cuda, cuda:N)")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"DEVICE '{self.device}' is not available on this machine (torch.cuda.is_available() "
                              "is False): edit DEVICE in the rank file or rerun disagg-init with --device cpu")
        if self.block_size < 1 or self.num_blocks < 1:
            raise ConfigError(f"block_size and num_blocks must be >= 1, got {self.block_size}, {self.num_blocks}")
        if not (0 < self.port < 65536):
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if not self.kv_ttl_s > 0:
            raise ConfigError(f"kv_ttl_s must be > 0, got {self.kv_ttl_s}")
        return self

    def model_spec(self):
        from torchinferno.engine.assembly import ModelSpec

        return ModelSpec(model=self.model, model_kind=None if self.model else self.model_kind, size=self.size,
                         seed=self.seed, dtype=self.dtype, device=self.device, prepack=False)

    def with_overrides(self, **kw: Any) -> RankConfig:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


@dataclass
class _Held:
    """A prefilled request whose KV blocks this (prefill) rank still owns."""

    blocks: list[int]
    prompt: list[int]
    first_token: int
    expires_at: float
    rng_state: torch.Tensor | None = None


@dataclass
class RankStats:
    prefills: int = 0
    decodes: int = 0
    released: int = 0
    expired: int = 0
    refused: int = 0
    kv_bytes_sent: int = 0
    kv_bytes_received: int = 0
    extra: dict = field(default_factory=dict)


def _kv_dtype(name: str, device: torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """``auto``: float32 on CPU, the model's dtype on CUDA; else a ``--kv-cache-dtype`` spelling (fp8 included)."""
    from torchinferno.kernels.kv_dtype import parse_kv_cache_dtype

    if name == "auto":
        return torch.float32 if device.type == "cpu" else model_dtype
    return parse_kv_cache_dtype(name) or model_dtype


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a tensor index_select/index_copy_ handle on every device: FP8 caches move as their raw bytes."""
    from torchinferno.kernels.kv_dtype import is_fp8

    return t.view(torch.uint8) if is_fp8(t.dtype) else t


class DisaggRank:
    """The state of one rank: build once, then call ``health``/``prefill``/``kv``/``decode``/``release``
    (the HTTP layer, ``disagg_http``, maps each RPC to one of them). ``clock`` is injectable for TTL tests."""

    def __init__(self, config: RankConfig, model=None, clock: Callable[[], float] = time.monotonic):
        from torchinferno.cache.block_pool import BlockPool
        from torchinferno.cache.kv_cache import allocate_kv_cache
        from torchinferno.engine.assembly import build_model
        from torchinferno.engine.generate import _param_dtype
        from torchinferno.models.common.step_model import step_model

        self.config = config.validate()
        self.clock = clock
        base = model if model is not None else build_model(config.model_spec())
        self.device = torch.device(config.device)
        self.family = base.family
        self.model = step_model(base, self.device) if self.device.type == "cpu" else base
        self.model_config = base.config
        self.kv_spec = self.family.kv_spec(base.config)
        self.kv_dtype = _kv_dtype(config.kv_cache_dtype, self.device, _param_dtype(base))
        self.cache = allocate_kv_cache(self.kv_spec, config.block_size, self.kv_dtype, self.device,
                                       num_blocks=config.num_blocks)
        self.pool = BlockPool(config.num_blocks, config.block_size,
                              enable_prefix_caching=config.prefix_caching and config.role == "prefill")
        self.held: dict[str, _Held] = {}
        self.stats = RankStats()
        self.lock = threading.RLock()
        self.vocab_size = int(base.config.vocab_size)
        self.max_model_len = int(base.config.max_position_embeddings)
        self.eos_ids = set(getattr(base.config, "eos_token_ids", ()) or ())
        src = config.model or f"tiny-{self.family.name}:{config.size}:seed{config.seed}"
        self.model_id = f"{src}:{config.dtype}"  # same on both sides of a handoff, or the decode rank refuses it
        # Flat [num_blocks * block_size, *shape] views of every cache tensor (gather/scatter by slot).
        self._flat = [(name, i, j, self.cache.tensors[i][j].view(-1, *shape))
                      for name, i, j, shape in kv_tensor_names(self.kv_spec)]

    # ------------------------------------------------------------------------------------------ helpers
    def _slots(self, blocks: list[int], n: int) -> torch.Tensor:
        """[n] cache slots of positions 0..n-1 of a sequence on ``blocks``."""
        bs = self.config.block_size
        pos = torch.arange(n)
        return (torch.tensor(blocks, dtype=torch.long)[pos // bs] * bs + pos % bs).to(self.device)

    def _request_id(self, control: dict) -> str:
        rid = control.get("request_id")
        if not isinstance(rid, str) or not rid or len(rid) > 256:
            raise RpcError(400, f"request_id must be a non-empty string (<= 256 chars), got {rid!r:.60}")
        return rid

    def _token_ids(self, control: dict, key: str) -> list[int]:
        ids = control.get(key)
        if not isinstance(ids, list) or not ids:
            raise RpcError(400, f"{key} must be a non-empty list of token ids")
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not (0 <= t < self.vocab_size):
                raise RpcError(400, f"{key} holds {t!r:.40}: token ids are integers in [0, {self.vocab_size})")
        return ids

    def _sampling(self, control: dict, prompt_len: int) -> SamplingParams:
        raw = control.get("sampling", {})
        if not isinstance(raw, dict):
            raise RpcError(400, "sampling must be a JSON object")
        unknown = sorted(set(raw) - set(SAMPLING_FIELDS))
        if unknown:
            raise RpcError(400, f"unknown sampling field '{unknown[0]}' (valid: {', '.join(SAMPLING_FIELDS)})")
        try:
            sp = SamplingParams(**raw).validate()
        except (TypeError, ValueError) as e:  # e.g. stop_token_ids that is not a list
            raise RpcError(400, f"bad sampling parameters: {str(e).splitlines()[0] if str(e) else e!r}") from None
        if prompt_len + sp.max_tokens > self.max_model_len:
            raise RpcError(400, f"prompt ({prompt_len} tokens) + max_tokens ({sp.max_tokens}) exceeds the model's "
                                f"context length {self.max_model_len}")
        return sp

    def _finish(self, tok: int, n_out: int, sp: SamplingParams) -> str | None:
        if tok in sp.stop_token_ids or (not sp.ignore_eos and tok in self.eos_ids):
            return "stop"
        return "length" if n_out >= sp.max_tokens else None

    def _allocate(self, n_slots: int) -> list[int]:
        need = math.ceil(n_slots / self.config.block_size)
        if need > self.pool.num_free:
            raise RpcError(503, f"no room: {need} KV blocks needed, {self.pool.num_free} free of "
                                f"{self.pool.num_blocks} (retry after running requests finish or are released)")
        return self.pool.allocate(need)

    def _prefix_blocks(self, prompt: list[int]) -> tuple[list[int], list[int], int]:
        """Blocks for a prompt: the longest cached run of its leading full blocks (at least one token is left to
        compute: the first token's logits), then fresh ones. Returns (blocks, full-block hashes, cached tokens)."""
        from torchinferno.cache.block_pool import hash_token_blocks

        bs, n = self.config.block_size, len(prompt)
        hashes = hash_token_blocks(prompt, bs) if self.pool.enable_prefix_caching else []
        hit = self.pool.lookup(hashes[: (n - 1) // bs])
        need = math.ceil(n / bs) - len(hit)
        if need > self.pool.num_free - self.pool.num_reclaimed_by(hit):
            raise RpcError(503, f"no room: {need} KV blocks needed, {self.pool.num_free} free of "
                                f"{self.pool.num_blocks} (retry after held requests are released)")
        self.pool.touch(hit)
        blocks = hit + self.pool.allocate(need)
        self.pool.record_prefix_query(n, len(hit) * bs)
        return blocks, hashes, len(hit) * bs

    def _forward_sample(self, ids: list[int], ctx: int, blocks: list[int], sp: SamplingParams, gen) -> int:
        """Run ``ids`` after ``ctx`` cached tokens of one sequence on ``blocks``; sample the next token."""
        from torchinferno.models.common.attention_metadata import (
            build_attention_metadata,
            positions_for,
        )
        from torchinferno.text.sampling import sample

        meta = build_attention_metadata([len(ids)], [ctx], [blocks], self.config.block_size, self.device)
        hidden = self.model(torch.tensor(ids, dtype=torch.long, device=self.device),
                            positions_for([len(ids)], [ctx], self.device), self.cache.tensors, meta)
        logits = self.model.compute_logits(hidden[meta.last_token_indices()])
        return int(sample(logits, [sp], [gen]).item())

    def _payload(self, held: _Held) -> dict[str, torch.Tensor]:
        slots = self._slots(held.blocks, len(held.prompt))
        out = {name: _rows(flat).index_select(0, slots).view(flat.dtype) for name, _, _, flat in self._flat}
        if held.rng_state is not None:
            out[RNG_STATE_KEY] = held.rng_state
        return out

    # ------------------------------------------------------------------------------------------ RPCs
    def expire(self) -> int:
        """Free held requests past their TTL; returns how many."""
        with self.lock:
            now = self.clock()
            gone = [rid for rid, h in self.held.items() if h.expires_at <= now]
            for rid in gone:
                self.pool.free(reversed(self.held.pop(rid).blocks))
            self.stats.expired += len(gone)
            return len(gone)

    def health(self) -> dict[str, Any]:
        self.expire()
        c = self.config
        with self.lock:
            return {
                "status": "ok", "role": c.role, "rank": c.rank, "port": c.port, "family": self.family.name,
                "model": c.model, "model_kind": None if c.model else c.model_kind, "size": c.size, "seed": c.seed,
                "dtype": c.dtype, "device": str(self.device), "kv_dtype": str(self.kv_dtype).removeprefix("torch."),
                "block_size": c.block_size, "num_blocks": c.num_blocks, "free_blocks": self.pool.num_free,
                "held_requests": sorted(self.held), "kv_bytes_per_token": self.kv_spec.bytes_per_token(self.kv_dtype),
                "kv_ttl_s": c.kv_ttl_s, "vocab_size": self.vocab_size, "max_model_len": self.max_model_len,
                "stats": {k: v for k, v in vars(self.stats).items() if k != "extra"},
                "prefix_cache": {"enabled": self.pool.enable_prefix_caching, "hit_rate": self.pool.prefix_hit_rate,
                                 "cached_blocks": self.pool.num_cached_blocks},
            }

    @torch.inference_mode()
    def prefill(self, control: dict) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """``{request_id, prompt_token_ids, sampling}`` -> (reply control, KV payload); see the module docstring."""
        from torchinferno.text.sampling import make_generator

        self.expire()
        with self.lock:
            rid = self._request_id(control)
            if rid in self.held:
                raise RpcError(409, f"request_id '{rid}' is already held by this prefill rank (release it first)")
            prompt = self._token_ids(control, "prompt_token_ids")
            sp = self._sampling(control, len(prompt))
            t0 = time.perf_counter()
            blocks, hashes, ctx = self._prefix_blocks(prompt)
            try:
                gen = make_generator(sp.seed, self.device) if sp.seed is not None else None
                tok = self._forward_sample(prompt[ctx:], ctx, blocks, sp, gen)
                for i in range(len(hashes)):  # offer the now-written full blocks to later prompts
                    self.pool.cache_block(blocks[i], hashes[i])
                rng = gen.get_state() if gen is not None and not sp.greedy else None
                held = _Held(blocks, list(prompt), tok, self.clock() + self.config.kv_ttl_s, rng)
                finish = self._finish(tok, 1, sp)
                t1 = time.perf_counter()
                tensors = {} if finish else self._payload(held)
            except BaseException:
                self.pool.free(reversed(blocks))
                raise
            if finish:
                self.pool.free(reversed(blocks))  # nothing to hand off: the request ended on its first token
            else:
                self.held[rid] = held
            self.stats.prefills += 1
            kv_bytes = kv_payload_bytes(tensors)
            self.stats.kv_bytes_sent += kv_bytes
            return ({"request_id": rid, "model_id": self.model_id, "first_token": tok, "finish_reason": finish,
                     "num_prompt_tokens": len(prompt),
                     "cached_tokens": ctx, "kv_bytes": kv_bytes, "kv_dtype": str(self.kv_dtype).removeprefix("torch."),
                     "prefill_s": t1 - t0, "pack_s": time.perf_counter() - t1}, tensors)

    def kv(self, control: dict) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """``{request_id}`` -> the held request's KV again (e.g. to retry on another decode rank)."""
        self.expire()
        with self.lock:
            rid = self._request_id(control)
            held = self.held.get(rid)
            if held is None:
                raise self._unknown(rid)
            tensors = self._payload(held)
            return ({"request_id": rid, "model_id": self.model_id, "first_token": held.first_token, "finish_reason": None,
                     "num_prompt_tokens": len(held.prompt), "kv_bytes": kv_payload_bytes(tensors),
                     "kv_dtype": str(self.kv_dtype).removeprefix("torch.")}, tensors)

    @torch.inference_mode()
    def decode(self, control: dict, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Control ``{request_id, prompt_token_ids, first_token, sampling}`` + the prompt's KV payload -> the
        request's tokens (``token_ids`` starts with ``first_token``)."""
        with self.lock:
            rid = self._request_id(control)
            prompt = self._token_ids(control, "prompt_token_ids")
            first = control.get("first_token")
            if not isinstance(first, int) or isinstance(first, bool) or not (0 <= first < self.vocab_size):
                raise RpcError(400, f"first_token must be a token id in [0, {self.vocab_size}), got {first!r:.40}")
            sp = self._sampling(control, len(prompt))
            other = control.get("model_id")
            if other is not None and other != self.model_id:
                raise RpcError(400, f"the KV comes from model '{other:.200}', this decode rank runs '{self.model_id}'")
            check_kv_payload(tensors, self.kv_spec, self.kv_dtype, len(prompt))
            rng = tensors.get(RNG_STATE_KEY)
            if not sp.greedy and sp.seed is not None and rng is None:
                raise RpcError(400, f"a seeded sampled request needs the prefill rank's '{RNG_STATE_KEY}' tensor")
            n = len(prompt)
            t0 = time.perf_counter()
            blocks = self._allocate(n + sp.max_tokens - 1)  # the last sampled token is never fed back
            try:
                gen = None
                if sp.seed is not None and not sp.greedy:
                    gen = torch.Generator(device=self.device)
                    try:
                        gen.set_state(rng.cpu() if self.device.type == "cpu" else rng)
                    except RuntimeError as e:
                        raise RpcError(400, f"'{RNG_STATE_KEY}' is not a generator state of this device: "
                                            f"{str(e).splitlines()[0]}") from None
                slots = self._slots(blocks, n)
                for name, _, _, flat in self._flat:
                    _rows(flat).index_copy_(0, slots, _rows(tensors[name]).to(self.device))
                t1 = time.perf_counter()
                out = [first]
                finish = self._finish(first, 1, sp)
                while finish is None:
                    out.append(self._forward_sample([out[-1]], n + len(out) - 1, blocks, sp, gen))
                    finish = self._finish(out[-1], len(out), sp)
            finally:
                self.pool.free(blocks)
            self.stats.decodes += 1
            kv_bytes = kv_payload_bytes(tensors)
            self.stats.kv_bytes_received += kv_bytes
            return {"request_id": rid, "token_ids": out, "finish_reason": finish, "num_prompt_tokens": n,
                    "kv_bytes_received": kv_bytes, "unpack_s": t1 - t0, "decode_s": time.perf_counter() - t1}

    def release(self, control: dict) -> dict[str, Any]:
        """``{request_id}`` -> frees the request's held KV blocks; 404 when this rank holds no such request."""
        self.expire()
        with self.lock:
            rid = self._request_id(control)
            held = self.held.pop(rid, None)
            if held is None:
                raise self._unknown(rid)
            self.pool.free(reversed(held.blocks))
            self.stats.released += 1
            return {"request_id": rid, "released": True, "freed_blocks": len(held.blocks)}

    def _unknown(self, rid: str) -> RpcError:
        where = "never prefilled here, already released, or expired after kv_ttl_s" if self.config.role == "prefill" \
            else "a decode rank holds no KV between requests"
        return RpcError(404, f"unknown request_id '{rid}' ({where})")
