"""``torchinferno.runtime.*``: the original's documented runtime import paths, as thin re-exports of where
each piece really lives (nothing is imported until a submodule is asked for).

* ``runtime.sampling``: greedy/temperature/top-k/top-p/min-p sampling (``text.sampling``);
* ``runtime.paged``: the paged KV block pool and cache tensors (``cache/``);
* ``runtime.paged_attention``: the torch paged causal attention reference (``models.common.attention``);
* ``runtime.cudagraphs``: CUDA-graph decode capture/replay (``kernels.cuda_graphs``, ``engine.graph_runner``);
* ``runtime.serving``: the token-step continuous-batching engine and offline ``LLM`` (``engine/``);
* ``runtime.prefix``: prefix-aware routing and the chained block hashes it matches on (``engine.router``);
* ``runtime.prefix_cache``: the automatic prefix cache inside the block pool (``cache.block_pool``);
* ``runtime.simulation``: time-sliced virtual GPUs and the serving simulator's executor (``workbench.timeslice``,
  ``sim/``); ``runtime.scheduler``: P/D cluster planning (``sim.cluster``, ``sim.plan``); ``runtime.traffic``:
  seeded bursty traffic and trace replay (``sim.traffic``).
* ``runtime.fake_dist``: fake process groups and collectives, tensor-parallel planning (``parallel.fake``).
* ``runtime.disagg``: agent-editable prefill/decode rank files and their local HTTP RPC (``disagg-init``,
  ``disagg-smoke``); its pieces are ``runtime.disagg_*``.
* ``runtime.disaggregated``: prefill/decode roles, their control protocol and the live KV handoff (``disagg/``).

Paths of the original with no implementation here (flex) do not exist:
importing them raises ``ImportError``.
"""
