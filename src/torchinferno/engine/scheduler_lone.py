"""The scheduler's lone graph prefill rule (``EngineConfig.graph_prefill_alone``; ``engine.scheduler``'s docstring).

A mixin of ``engine.scheduler.Scheduler``, which owns every attribute used here (``waiting``, ``running``, ``pool``,
``sliding``, ``config``, ``block_size``, ``lone_prefill_tokens``, ``num_lone_prefills``, ``_finished_ids``) and the
helpers ``_prefix_hit`` and ``_admit``. Only the scheduler changes ``Request`` state.
"""

from __future__ import annotations

from torchinferno.cache.block_pool import cdiv
from torchinferno.engine.outputs import SchedulerOutput
from torchinferno.engine.request import RequestStatus


class LonePrefillMixin:
    def _lone_prefill(self) -> SchedulerOutput | None:
        """The step that is the one waiting prompt alone, when a prefill graph can replay it (engine.scheduler's docstring)."""
        if len(self.waiting) != 1 or not self.running or self.sliding is not None:
            return None
        req = self.waiting[0]
        n = req.num_tokens
        if (req.status != RequestStatus.WAITING or req.num_inflight or n > self.lone_prefill_tokens
                or n > self.config.max_num_batched_tokens or len(self.running) >= self.config.max_num_seqs
                or req.sampling_params.prompt_logprobs is not None or self._prefix_hit(req)):
            return None
        need = cdiv(n, self.block_size)
        if need > self.pool.num_free:
            return None
        self.waiting.popleft()
        self.num_lone_prefills += 1
        scheduled = self._admit(req, [], need, n)
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(scheduled=[scheduled], preempted_ids=[], finished_ids=finished)
