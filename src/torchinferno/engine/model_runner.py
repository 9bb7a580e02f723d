"""Turns a ``SchedulerOutput`` into one flattened forward over the paged cache and samples.

Every batch shape (prefill, decode, chunked prefill, mixed) is the same call: the scheduled
tokens of all requests are concatenated into ``input_ids [T]`` / ``positions [T]``, the attention
metadata says where each request's queries start and where its KV lives, and logits are computed
only at the last position of requests that sample this step. The attention backend is whatever
the model was built with; this file only builds host metadata and moves it to the model's device.
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.cache.kv_cache import PagedKVCache
from torchinferno.engine.outputs import ModelRunnerOutput, SchedulerOutput, TokenLogprob
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.text.sampling import compute_logprobs, make_generator, sample

__all__ = ["ModelRunner"]


class ModelRunner:
    """Executes scheduled steps of ``model`` against ``kv_cache``.

    Keeps one ``torch.Generator`` per seeded request (created on first sight, dropped when the
    scheduler reports the request finished), so a seeded request draws the same tokens whatever
    it is batched with and across preemptions (recompute never samples).
    """

    def __init__(self, model: nn.Module, kv_cache: PagedKVCache):
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self._generators: dict[str, torch.Generator] = {}
        self.num_forward_calls = 0

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            self._generators.pop(rid, None)

    def _generator(self, rid: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        g = self._generators.get(rid)
        if g is None:
            g = self._generators[rid] = make_generator(seed, self.device)
        return g

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.forget(sched.finished_ids)
        out = ModelRunnerOutput()
        if not sched.scheduled:
            return out
        reqs = sched.scheduled
        query_lens = [s.num_tokens for s in reqs]
        context_lens = [s.num_computed_tokens for s in reqs]
        bs = self.kv_cache.block_size
        # Only the blocks covering each request's tokens so far (a narrower block table).
        tables = [s.block_ids[: -(-(c + q) // bs)] for s, c, q in zip(reqs, context_lens, query_lens)]
        meta = build_attention_metadata(query_lens, context_lens, tables, bs, self.device)
        ids = torch.tensor([t for s in reqs for t in s.token_ids], dtype=torch.long).to(self.device)
        pos = torch.cat([torch.arange(c, c + q) for c, q in zip(context_lens, query_lens)]).to(self.device)
        hidden = self.model(ids, pos, self.kv_cache.tensors, meta)  # [T, D]
        self.num_forward_calls += 1

        rows = [i for i, s in enumerate(reqs) if s.sample]
        if not rows:
            return out
        last = meta.query_start_loc[1:].long() - 1  # [B]
        idx = last[torch.tensor(rows, dtype=torch.long, device=self.device)] if len(rows) < len(reqs) else last
        logits = self.model.compute_logits(hidden[idx])  # [N, V] fp32
        params = [reqs[i].sampling_params for i in rows]
        gens = [self._generator(reqs[i].request_id, reqs[i].sampling_params.seed) for i in rows]
        tokens = sample(logits, params, gens)  # [N]
        token_list = tokens.tolist()
        for i, t in zip(rows, token_list):
            out.sampled_token_ids[reqs[i].request_id] = t

        want = [j for j, p in enumerate(params) if p.logprobs is not None]
        if want:
            k = max(params[j].logprobs for j in want)
            sel = torch.tensor(want, dtype=torch.long, device=logits.device)
            chosen, top_ids, top_lp = compute_logprobs(logits[sel], tokens[sel], k)
            chosen, top_ids, top_lp = chosen.tolist(), top_ids.tolist(), top_lp.tolist()
            for n, j in enumerate(want):
                kj = params[j].logprobs
                out.logprobs[reqs[rows[j]].request_id] = TokenLogprob(
                    token_list[j], chosen[n], top_ids[n][:kj], top_lp[n][:kj])
        return out
