"""What a rank of a tensor-parallel model is: world size, its rank, the collective backend."""

from __future__ import annotations

from dataclasses import dataclass

from torchinferno.errors import ConfigError

BACKENDS = ("gloo", "nccl", "fake")


@dataclass(frozen=True)
class ParallelConfig:
    """``tp_size`` ranks split every layer (``mode="pipeline"``: hold a stage of layers each); this process is ``rank``. ``backend``: ``gloo`` (CPU), ``nccl``
    (CUDA) or ``fake`` (one process planning a world it does not run: ``runtime.fake_dist``).

    Invariant: ``0 <= rank < tp_size``; ``tp_size == 1`` is the unsharded model (no collectives run)."""

    tp_size: int = 1
    rank: int = 0
    backend: str = "gloo"
    mode: str = "tensor"  # tensor: every layer split; pipeline: layers placed in stages (parallel/pipeline.py)

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ConfigError(f"--tensor-parallel-size must be >= 1 (got {self.tp_size})")
        if not 0 <= self.rank < self.tp_size:
            raise ConfigError(f"rank {self.rank} is outside a tensor-parallel world of {self.tp_size}")
        if self.mode not in ("tensor", "pipeline"):
            raise ConfigError(f"unknown parallelism {self.mode!r} (valid: tensor, pipeline)")
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown collective backend {self.backend!r} (valid: {', '.join(BACKENDS)})")

    def split(self, n: int, what: str) -> tuple[int, int]:
        """``(start, count)`` of this rank's even share of ``n`` items (heads, experts, rows)."""
        if n % self.tp_size:
            raise ConfigError(f"{what}={n} is not divisible by --tensor-parallel-size {self.tp_size}")
        count = n // self.tp_size
        return self.rank * count, count

    def padded_split(self, n: int) -> tuple[int, int, int]:
        """``(start, count_real, count_padded)``: a share of ``n`` rows padded so every rank holds the same
        number (the vocabulary of the embedding and head; padded rows are zero and cut from the logits)."""
        per = -(-n // self.tp_size)
        start = min(n, self.rank * per)
        return start, min(n, start + per) - start, per

    def kv_heads(self, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
        """GQA ``(first kv head, local kv heads)`` of this rank: split when there are at least as many KV
        heads as ranks, else each rank keeps (a replica of) the one KV head its query heads read."""
        h0, _ = self.split(num_heads, "num_attention_heads")
        if num_kv_heads >= self.tp_size:
            return self.split(num_kv_heads, "num_key_value_heads")
        if self.tp_size % num_kv_heads:
            raise ConfigError(f"num_key_value_heads={num_kv_heads} neither divides nor is a multiple of "
                              f"--tensor-parallel-size {self.tp_size}")
        group = num_heads // num_kv_heads
        return h0 // group, 1
