"""Tensor parallelism on CPU gloo ranks (spawned): logits, greedy and seeded-sampled tokens equal TP=1."""

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.models.registry import get_family
from torchinferno.parallel.checks import check_split, rank_outputs
from torchinferno.parallel.config import ParallelConfig
from torchinferno.parallel.plan import ShardRule


def _tp4_rank(comm):
    return rank_outputs(comm, "llama3"), _tied_rank_logits(comm)


def test_llama3_tp4_equals_single_device():
    """Prompt logits within 1e-5 of TP=1; greedy and seeded temperature tokens equal on every rank (TP=4 keeps
    a replica of one KV head per rank: 2 KV heads < 4 ranks). TP=2 of every family: test_variants_tp.py.
    Same world: a tied head over a padded vocabulary (261 rows in shares of 66; the head reads the
    vocab-parallel embedding's rows, still one tensor after materializing)."""
    from torchinferno.parallel.spawn import run_ranks

    ref = rank_outputs(None, "llama3")
    full = _tied_full()
    with torch.no_grad():
        tied_want = full.compute_logits(full(torch.arange(7) + 3, torch.arange(7)))
    for out, tied in run_ranks(_tp4_rank, 4):
        assert float((out["logits"] - ref["logits"]).abs().max()) <= 1e-5
        assert out["greedy"] == ref["greedy"] and out["sampled"] == ref["sampled"]
        assert tied.shape == (7, 261) and torch.allclose(tied, tied_want, atol=1e-5, rtol=0)


def test_split_refusals_are_one_line():
    with pytest.raises(ConfigError, match="num_attention_heads=4 is not divisible by --tensor-parallel-size 3"):
        check_split(get_family("llama3"), get_family("llama3").size("debug"), 3)
    with pytest.raises(ConfigError, match="n_routed_experts=8"):
        cfg = get_family("dsv4").size("debug")
        from dataclasses import replace
        check_split(get_family("dsv4"), replace(cfg, num_attention_heads=16, intermediate_size=1024,
                                                moe_intermediate_size=64), 16)


def test_kv_heads_split_or_replicated():
    # 8 query heads, 2 KV heads: TP 2 splits them; TP 4 and 8 keep the one KV head each rank's queries read
    assert [ParallelConfig(2, r).kv_heads(8, 2) for r in range(2)] == [(0, 1), (1, 1)]
    assert [ParallelConfig(4, r).kv_heads(8, 2) for r in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    with pytest.raises(ConfigError, match="num_key_value_heads=3"):
        ParallelConfig(2, 0).kv_heads(6, 3)


def test_shard_rule_reads_padded_zero_and_skipped_parts():
    t = torch.arange(12.0).view(6, 2)
    assert torch.equal(ShardRule(dim=0, start=4, count=2, pad_to=3).read(t), torch.tensor([[8.0, 9], [10, 11], [0, 0]]))
    assert torch.equal(ShardRule(dim=1, start=1, count=1).read(t), t[:, 1:])
    assert not ShardRule(zero=True).read(t).any()
    assert ParallelConfig(4, 3).padded_split(259) == (195, 64, 65)


def test_llm_refuses_an_unsplittable_world_before_starting_workers():
    from torchinferno.engine.assembly import ModelSpec
    from torchinferno.engine.llm import LLM

    with pytest.raises(ConfigError, match="num_attention_heads=4 is not divisible by --tensor-parallel-size 3"):
        LLM(ModelSpec(model_kind="llama3", dtype="float32"), tensor_parallel_size=3)


def _tied_config():
    from dataclasses import replace

    return replace(get_family("llama3").size("debug"), tie_word_embeddings=True, vocab_size=261)  # 261: padded shares


def _tied_full():
    from torchinferno.testing import randomize_

    torch.manual_seed(0)
    return randomize_(get_family("llama3").build(_tied_config(), device="cpu").eval())


def _tied_rank_logits(comm):
    from torchinferno.parallel.load import build_rank, shard_tensors

    fam, full = get_family("llama3"), _tied_full()
    model = build_rank(fam, _tied_config(), comm, lambda rule: shard_tensors(fam.export_weights(full), rule))
    with torch.no_grad():
        return model.compute_logits(model(torch.arange(7) + 3, torch.arange(7)))


def test_a_rank_reads_only_its_slices_from_safetensors(tmp_path):
    from torchinferno.checkpoint.auto import save_pretrained
    from torchinferno.models.llama3.parallel import tensor_rule
    from torchinferno.parallel.load import shard_checkpoint
    from torchinferno.testing import tiny_model

    full = tiny_model("llama3")
    ckpt = save_pretrained(full, tmp_path)
    cfg, pcfg = full.config, ParallelConfig(2, 1)
    got = dict(shard_checkpoint(ckpt, lambda name: tensor_rule(name, cfg, pcfg)))
    ref = dict(get_family("llama3").export_weights(full))
    q = "model.layers.0.self_attn.q_proj.weight"  # 4 heads of 16: rank 1 holds rows 32..63
    assert torch.equal(got[q], ref[q][32:64])
    o = "model.layers.1.self_attn.o_proj.weight"
    assert torch.equal(got[o], ref[o][:, 32:64])
    emb = "model.embed_tokens.weight"  # 259 rows: rank 1 holds 130..258 and one zero row of padding
    assert got[emb].shape == (130, 64) and torch.equal(got[emb][:129], ref[emb][130:]) and not got[emb][129].any()
    norm = "model.norm.weight"
    assert torch.equal(got[norm], ref[norm])
