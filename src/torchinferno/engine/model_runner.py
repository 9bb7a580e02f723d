"""Turns a ``SchedulerOutput`` into one flattened forward over the paged cache and samples.

Every batch shape (prefill, decode, chunked prefill, mixed) is the same call: the scheduled
tokens of all requests are concatenated into ``input_ids [T]`` / ``positions [T]``, the attention
metadata says where each request's queries start and where its KV lives, and logits are computed
only at the last position of requests that sample this step. The attention backend is whatever
the model was built with; the host-side inputs come from ``engine.input_batch.InputBatch`` (a
persistent block table and one host-to-device copy per step).

``execute_async`` launches a step and returns a ``StepHandle`` without waiting for the device
(async scheduling); ``execute`` is ``execute_async(...).result()``. The runner remembers the
previous step's sampled tokens on the device, so a step scheduled before those reached the host
(``PLACEHOLDER_TOKEN`` inputs) gets them by a device-side gather before its forward.
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.cache.kv_cache import PagedKVCache
from torchinferno.engine.input_batch import InputBatch, StepInputs
from torchinferno.engine.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput, TokenLogprob
from torchinferno.engine.step_handle import LogprobRows, StepHandle
from torchinferno.text.sampling import compute_logprobs, make_generator, sample, values_to_device

__all__ = ["ModelRunner"]


class ModelRunner:
    """Executes scheduled steps of ``model`` against ``kv_cache`` eagerly.

    Keeps one ``torch.Generator`` per seeded request (created on first sight, dropped when the
    scheduler reports the request finished), so a seeded request draws the same tokens whatever
    it is batched with and across preemptions (recompute never samples).

    Invariant: ``execute`` / ``execute_async`` see every ``SchedulerOutput`` of the engine, in
    order (the input batch releases a request's block-table row when it is reported finished or
    preempted, and a placeholder token refers to the immediately preceding step's samples).
    Seeded generators draw once per sampling step of their request, in step order, so async
    scheduling draws what the synchronous engine draws (plus, at most, one draw after a request
    finished, which nobody sees). ``max_num_seqs`` / ``max_model_len`` only size the persistent
    host buffers.
    """

    def __init__(self, model: nn.Module, kv_cache: PagedKVCache, max_num_seqs: int = 64,
                 max_model_len: int | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        bs = kv_cache.block_size
        max_blocks = -(-max_model_len // bs) if max_model_len else 16
        self.inputs = InputBatch(bs, self.device, max_num_seqs, max_blocks, hybrid=kv_cache.spec.is_hybrid)
        self._generators: dict[str, torch.Generator] = {}
        # The previous step's sampled tokens [n_prev] (device) and request id -> row; None when it
        # sampled nothing. Read by the next step's placeholder fill (stream-ordered after it).
        self._prev_tokens: torch.Tensor | None = None
        self._prev_rows: dict[str, int] | None = None
        self.num_forward_calls = 0
        self.num_graph_steps = 0  # decode steps replayed from CUDA graphs (CudaGraphModelRunner)
        # One fresh prompt's prefill from per-length CUDA graphs (kernels.cuda_graphs_prefill), set by
        # CudaGraphModelRunner; None: every prefill runs eagerly
        self.prefill_graphs = None
        self.num_graph_prefills = 0
        # Any other step of up to its ``max_tokens`` tokens from graphs, set by CudaGraphModelRunner: graphed segments
        # around eager attention (kernels.cuda_graphs_piecewise) or one whole-step graph per token bucket
        # (kernels.cuda_graphs_mixed); None: such steps run eagerly
        self.piecewise = None
        self.num_piecewise_steps = 0

    @property
    def uses_cuda_graphs(self) -> bool:
        return False

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            self._generators.pop(rid, None)

    def _begin(self, sched: SchedulerOutput) -> None:
        """Drop per-request state of requests that left since the last step."""
        if sched.finished_ids:
            self.forget(sched.finished_ids)
            self.inputs.release(sched.finished_ids)
        if sched.preempted_ids:
            self.inputs.release(sched.preempted_ids)

    def _generator(self, rid: str, seed: int | None, prior_draws: int = 0, width: int = 0) -> torch.Generator | None:
        """The request's generator; a new one first replays ``prior_draws`` row draws of ``width`` values (the
        draws another engine made for it: prefill/decode disaggregation), so it continues where that one stopped."""
        if seed is None:
            return None
        g = self._generators.get(rid)
        if g is None:
            g = self._generators[rid] = make_generator(seed, self.device)
            for _ in range(prior_draws):  # one sampling row draws exactly this (text/sampling.py _draw)
                torch.empty(width, device=self.device).exponential_(generator=g)
        return g

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and wait for its sampled tokens."""
        return self.execute_async(sched).result()

    @torch.inference_mode()
    def execute_async(self, sched: SchedulerOutput) -> StepHandle:
        """Launch one step (forward, sampling, logprobs); the handle's ``result()`` waits for it."""
        self._begin(sched)
        reqs = sched.scheduled
        if not reqs:
            return self._sampled_nothing()
        step = self._prepare(reqs)
        if self.graph_prefillable(reqs):
            logits = self.prefill_graphs.run(step.input_ids, step.slot_mapping)  # [1, V] fp32: the last token's
            self.num_forward_calls += 1
            self.num_graph_prefills += 1
            return self._sample(reqs, step.sample_rows, logits) if step.sample_rows else self._sampled_nothing()
        hidden = self._hidden(step)  # [T, D]
        self.num_forward_calls += 1
        prompt_lps = self._prompt_logprobs(reqs, hidden) if any(s.prompt_logprob_targets for s in reqs) else {}
        if not step.sample_rows:
            handle = self._sampled_nothing()
        else:
            # Every row samples its only token (pure decode): no gather needed.
            sel = hidden if step.num_tokens == len(step.sample_rows) else hidden[step.sample_indices]
            logits = self.model.compute_logits(sel)  # [N, D] -> [N, V] fp32
            handle = self._sample(reqs, step.sample_rows, logits)
        handle.prompt_logprobs = prompt_lps
        return handle

    def _hidden(self, step: StepInputs) -> torch.Tensor:
        """The step's hidden states ``[T, D]``: from the piecewise graphs when they take ``T`` tokens (a view of their
        static buffer, consumed before the next step's forward), else the eager forward."""
        pw = self.piecewise
        if pw is not None and step.num_tokens <= pw.max_tokens:
            self.num_piecewise_steps += 1
            return pw.run(step.input_ids, step.positions, step.attention_metadata())
        return self.model(step.input_ids, step.positions, self.kv_cache.tensors, step.attention_metadata())

    @property
    def prefill_graph_tokens(self) -> int:
        """The longest fresh prompt ``prefill_graphs`` replays (0: none captured)."""
        return 0 if self.prefill_graphs is None else self.prefill_graphs.max_tokens

    @property
    def mixed_graph_mode(self) -> str:
        """How steps of up to ``piecewise_graph_tokens`` replay: "piecewise", "full" (one graph a step) or "eager"."""
        from torchinferno.kernels.cuda_graphs_mixed import MixedGraphRunner

        if self.piecewise is None:
            return "eager"
        return "full" if isinstance(self.piecewise, MixedGraphRunner) else "piecewise"

    @property
    def piecewise_graph_tokens(self) -> int:
        """The most tokens a step may have to run from the piecewise graphs (0: none captured)."""
        return 0 if self.piecewise is None else self.piecewise.max_tokens

    def graph_prefillable(self, reqs: list[ScheduledRequest]) -> bool:
        """The step is what ``prefill_graphs`` replays: one request, no cached context, a length of a bucket, no
        prompt logprobs (they need every row's hidden state)."""
        if self.prefill_graphs is None or len(reqs) != 1:
            return False
        s = reqs[0]
        return (s.num_computed_tokens == 0 and len(s.token_ids) <= self.prefill_graphs.max_tokens
                and not s.prompt_logprob_targets)

    def _prompt_logprobs(self, reqs: list[ScheduledRequest], hidden: torch.Tensor) -> dict[str, list[TokenLogprob]]:
        """Logprobs of prompt tokens at the positions ``prompt_logprob_targets`` asks for (``hidden [T, D]``,
        requests flattened in order). Synchronous: a rare path (echo + logprobs), not worth a pinned copy."""
        out: dict[str, list[TokenLogprob]] = {}
        offset = 0
        for s in reqs:
            targets = s.prompt_logprob_targets
            if targets:
                first = offset + s.prompt_logprob_start - s.num_computed_tokens  # flat row of the first position
                logits = self.model.compute_logits(hidden[first : first + len(targets)])  # [M, V] fp32
                k = s.sampling_params.prompt_logprobs
                tgt = torch.tensor(targets, dtype=torch.long, device=logits.device)
                chosen, top_ids, top_lp = (t.tolist() for t in compute_logprobs(logits, tgt, k))
                out[s.request_id] = [TokenLogprob(t, c, i, v) for t, c, i, v in zip(targets, chosen, top_ids, top_lp)]
            offset += s.num_tokens
        return out

    def _prepare(self, reqs: list[ScheduledRequest]) -> StepInputs:
        """Step inputs with placeholder tokens replaced by the previous step's samples (on device)."""
        step = self.inputs.prepare(reqs, self._prev_rows)
        if step.fill_dst is not None:
            step.input_ids.index_copy_(0, step.fill_dst, self._prev_tokens.index_select(0, step.fill_src))
        return step

    def _sampled_nothing(self) -> StepHandle:
        self._prev_tokens = self._prev_rows = None
        return StepHandle.empty()

    def _sample(self, reqs: list[ScheduledRequest], rows: list[int], logits: torch.Tensor) -> StepHandle:
        """Sample ``logits [N, V]`` (row ``n`` belongs to ``reqs[rows[n]]``), with logprobs when asked.

        Launches only: no host-device synchronization (index lists go through pinned memory).
        """
        params = [reqs[i].sampling_params for i in rows]
        ids = [reqs[i].request_id for i in rows]
        gens = None
        if any(p.seed is not None for p in params):
            gens = [self._generator(reqs[i].request_id, reqs[i].sampling_params.seed, reqs[i].prior_draws,
                                    logits.shape[1]) for i in rows]
        tokens = sample(logits, params, gens)  # [N]
        self._prev_tokens, self._prev_rows = tokens, dict(zip(ids, range(len(ids))))

        lp = None
        want = [j for j, p in enumerate(params) if p.logprobs is not None]
        if want:
            ks = [params[j].logprobs for j in want]
            if len(want) == len(rows):
                chosen, top_ids, top_lp = compute_logprobs(logits, tokens, max(ks))
            else:
                sel = values_to_device(want, torch.long, logits.device)
                chosen, top_ids, top_lp = compute_logprobs(logits[sel], tokens[sel], max(ks))
            lp = LogprobRows(want, ks, chosen, top_ids, top_lp)
        return StepHandle(ids, tokens, lp)
