"""KV cache tensors come from any KVSpec and are sized from bytes or a block count."""

import pytest
import torch

from torchinferno.cache.kv_cache import allocate_kv_cache, num_blocks_for_memory
from torchinferno.errors import ConfigError
from torchinferno.models.protocol import KVLayerSpec, KVSpec


def _mla_like_spec(layers=3):
    return KVSpec(layers=tuple(KVLayerSpec("mla", (("latent", (40,)),)) for _ in range(layers)))


def test_any_spec_is_allocated_from_a_memory_budget():
    spec = _mla_like_spec()
    bpt = spec.bytes_per_token(torch.float16)
    assert bpt == 3 * 40 * 2
    memory = bpt * 8 * 5 + 100  # five blocks of 8 tokens and change
    assert num_blocks_for_memory(spec, torch.float16, 8, memory) == 5
    kv = allocate_kv_cache(spec, 8, torch.float16, "cpu", memory_bytes=memory)
    assert kv.num_blocks == 5 and kv.num_tokens == 40 and len(kv.tensors) == 3
    assert [tuple(t.shape) for t in kv.tensors[0]] == [(5, 8, 40)]
    assert kv.nbytes == 5 * 8 * bpt and kv.nbytes <= memory


def test_mha_spec_by_block_count_and_clear_error_when_too_small():
    shape = (2, 4)
    spec = KVSpec(layers=(KVLayerSpec("mha", (("k", shape), ("v", shape))),))
    kv = allocate_kv_cache(spec, 16, torch.float32, "cpu", num_blocks=3)
    assert [tuple(t.shape) for t in kv.tensors[0]] == [(3, 16, 2, 4), (3, 16, 2, 4)]
    assert kv.bytes_per_token == 2 * 8 * 4
    with pytest.raises(ConfigError, match="holds no block"):
        allocate_kv_cache(spec, 16, torch.float32, "cpu", memory_bytes=100)
