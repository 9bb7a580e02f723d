"""Tensor-parallel plan of dsv4: the MLA + MoE plan it shares with deepseek-v3.2
(``models/common/mla_parallel.py``): heads split, latent cache replicated, experts split across ranks."""

from __future__ import annotations

from torchinferno.models.common import mla_parallel

check = mla_parallel.check
shard_model = mla_parallel.shard_model
tensor_rule = mla_parallel.tensor_rule
