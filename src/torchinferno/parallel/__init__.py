"""Tensor parallelism on ``torch.distributed`` (gloo on CPU, NCCL on CUDA) for every family.

* ``config.py``: :class:`ParallelConfig` (world size, rank, backend) and the rank-local split helpers;
* ``comm.py``: :class:`Comm`, the collectives a sharded model calls (all-reduce, all-gather) over one
  process group; no state of its own beyond what ``torch.distributed`` holds;
* ``layers.py``: vocab-parallel embedding and head, expert-parallel routed experts, the all-reduce hook
  of row-parallel blocks;
* ``plan.py``: the sharding plan helpers (GQA, MLA, MLP, MoE) a family's ``parallel.py`` composes, applied
  to a model built on ``meta``; ``ShardRule``: which slice of each checkpoint tensor a rank reads;
* ``load.py``: build one rank of a model (meta build -> plan -> materialize -> read only its shards);
* ``pipeline.py``: pipeline placement (``pipeline-v0``): contiguous stages of layers, activations sent at
  stage boundaries, the last stage's logits broadcast;
* ``spawn.py``: run a function on N spawned loopback ranks (tests, ``validate-model-variants``);
* ``fake.py``: fake process groups (``runtime.fake_dist``) and ``plan-parallel``'s per-rank plan;
* ``checks.py``: one-line refusals of a world size the model cannot be split over; TP/PP == one device checks.

The engine runs ranks through ``engine/multiproc_executor.py`` (spawned workers) or
``engine/torchrun_executor.py`` (launched by torchrun).
"""
