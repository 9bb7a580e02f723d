"""Fake process groups: a TP world planned in one process (shapes, memory per rank, collective counts)."""

import json

import pytest
import torch

from torchinferno.cli.main import main
from torchinferno.models.registry import get_family
from torchinferno.parallel.load import build_rank, shard_tensors
from torchinferno.runtime.fake_dist import LocalFakeComm, fake_world, plan_parallel
from torchinferno.testing import tiny_model


@pytest.mark.parametrize("kind,use_torch", [("llama3", True), ("deepseek-v3.2", True), ("dsv4", False)])
def test_fake_world_runs_a_rank_and_counts_the_plans_collectives(kind, use_torch):
    fam, full = get_family(kind), tiny_model(kind)
    with fake_world(4, rank=1, use_torch=use_torch) as comm:
        assert isinstance(comm, LocalFakeComm) != use_torch
        model = build_rank(fam, fam.size("debug"), comm, lambda rule: shard_tensors(fam.export_weights(full), rule))
        with torch.no_grad():
            logits = model.compute_logits(model(torch.arange(5) + 3, torch.arange(5)))
    plan = plan_parallel(kind, "debug", 4, torch.float32, batch=5)
    assert logits.shape == (5, fam.size("debug").vocab_size)
    assert comm.calls == {"all_reduce": plan.all_reduces_per_step, "all_gather": 1}
    assert comm.bytes["all_reduce"] == plan.all_reduce_bytes
    assert not torch.distributed.is_initialized()


def test_llama3_70b_at_tp8_splits_weights_and_kv_eightfold():
    one, eight = plan_parallel("llama3", "llama3-70b", 1), plan_parallel("llama3", "llama3-70b", 8)
    assert eight.kv_bytes_per_token * 8 == one.kv_bytes_per_token == 80 * 2 * 8 * 128 * 2
    assert abs(eight.weight_bytes * 8 / one.weight_bytes - 1) < 1e-3  # norms are replicated, vocab padded
    assert eight.all_reduces_per_step == 2 * 80 + 1 and eight.all_gathers_per_step == 1
    assert one.all_reduces_per_step == 0 and one.ring_bytes_sent == 0


def test_plan_parallel_command(capsys):
    assert main(["plan-parallel", "--size", "llama3-70b", "--tp", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tp"] == 8 and out["all_reduces_per_step"] == 161 and out["weight_bytes"] < 17.7e9
    assert main(["plan-parallel", "--size", "llama3-70b", "--tp", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_attention_heads=64 is not divisible by --tensor-parallel-size 3" in err[0]
