"""deepseek-v4 tensor parallelism (models/deepseek_v4/parallel.py) on spawned gloo ranks == one device.

The tiny V4 (sliding / CSA rate 4 / HCA rate 8 / CSA, window 6, indexer top-3) with its untrained tensors
(sinks, hash table ``tid2eid``, router bias, mHC bases) randomized, so a mis-split sink or a rank routing
differently shows. TP=2 through ``generate``: test_variants_tp.py (tp-v0); here TP=4 (one head per rank, half an
output group each, experts 2/1/2/1) step by step, and the engine at TP=2 reading its slices from safetensors.
"""

import json

import pytest

from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v4 import parallel as v4p
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.model import randomize_untrained_
from torchinferno.models.registry import get_family
from torchinferno.parallel.config import ParallelConfig
from torchinferno.testing import tiny_model

PROMPTS = [[5, 17, 99, 3, 250, 42, 7, 128, 64, 11, 200], [9, 301, 4, 77, 3]]
NEW = 12  # decode positions 11..22 / 5..16: CSA windows close at 11, 15, 19; HCA at 15; the window slides past


def _full():
    return randomize_untrained_(tiny_model("deepseek-v4", variant="v0"), seed=5)


def _steps(model) -> dict:
    """Logits of every generate step (prefill's last tokens, then each cached decode step) and the tokens."""
    seen = []
    plain = model.compute_logits

    def record(hidden):
        out = plain(hidden)
        seen.append(out.detach().cpu())
        return out

    model.compute_logits = record
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import StaticGenerator

    greedy = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    gen = StaticGenerator(model, 2, 32)
    tokens = [r.token_ids for r in gen.generate(PROMPTS, greedy)]
    sampled = [r.token_ids for r in gen.generate(PROMPTS, [SamplingParams(max_tokens=NEW, temperature=0.9, seed=s,
                                                                          ignore_eos=True) for s in (3, 4)])]
    return {"logits": seen[: NEW], "greedy": tokens, "sampled": sampled}


def _rank(comm):
    from torchinferno.parallel.load import build_rank, shard_tensors

    fam, full = get_family("deepseek-v4"), _full()
    model = build_rank(fam, fam.size("debug"), comm, lambda rule: shard_tensors(fam.export_weights(full), rule),
                       variant="v0")
    out = _steps(model)
    out["shapes"] = {n: tuple(p.shape) for n, p in model.named_parameters() if ".0." in n or "embed" in n}
    return out


def test_tp4_equals_tp1_at_prefill_and_every_cached_decode_step():
    from torchinferno.parallel.spawn import run_ranks

    ref = _steps(_full())
    worlds = run_ranks(_rank, 4)
    for rank, out in enumerate(worlds):
        assert len(out["logits"]) == NEW
        for step, (got, want) in enumerate(zip(out["logits"], ref["logits"])):
            assert got.shape == want.shape == (2, 320)
            assert float((got - want).abs().max()) <= 1e-5, (rank, step)
        assert out["greedy"] == ref["greedy"] and out["sampled"] == ref["sampled"], rank
    # one head per rank with its sink; half of output group rank // 2; experts 2/1/2/1; vocab 320 / 4
    s0, s1 = worlds[0]["shapes"], worlds[1]["shapes"]
    assert s0["model.layers.0.self_attn.sinks"] == (1,) and s0["model.layers.0.self_attn.q_b_proj.weight"] == (32, 48)
    assert s0["model.layers.0.self_attn.o_a_proj.weight"] == (24, 32)
    assert s0["model.layers.0.self_attn.o_b_proj.weight"] == (64, 24)
    assert s0["model.layers.0.self_attn.kv_proj.weight"] == (32, 64)  # the shared K=V head: replicated
    assert s0["model.layers.0.mlp.experts.gate_up_proj"][0] == 1 and s1["model.layers.0.mlp.experts.gate_up_proj"][0] == 2
    assert s0["model.layers.0.mlp.shared_experts.down_proj.weight"] == (64, 8)
    assert s0["model.embed_tokens.weight"] == (80, 64)


def test_engine_tp2_reads_its_slices_and_equals_tp1(tmp_path):
    """LLM(tensor_parallel_size=2) from a safetensors checkpoint: greedy, seeded sampling and a prefix-cache hit."""
    from torchinferno.checkpoint.auto import save_pretrained
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm import LLM

    ckpt = save_pretrained(_full(), tmp_path / "ckpt")
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0] + [8, 9]]  # the third hits the first's cached blocks
    params = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0.9, seed=4, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)]

    def run(llm):
        return llm.generate(prompts[:2], params[:2], use_tqdm=False) + llm.generate(prompts[2:], params[2:], use_tqdm=False)

    ref = [o.token_ids for o in run(LLM(str(ckpt), block_size=4, num_gpu_blocks=64))]
    llm = LLM(str(ckpt), block_size=4, num_gpu_blocks=64, tensor_parallel_size=2)
    try:
        got = run(llm)
        assert [o.token_ids for o in got] == ref
        assert got[2].num_cached_tokens > 0
    finally:
        llm.shutdown()


# ------------------------------------------------------------------ plan and rules (no world)


def test_output_share_whole_groups_or_part_of_one():
    cfg = tiny_deepseek_v4_config()  # 4 heads of 32, 2 output groups of 64 dims
    assert [v4p.output_share(cfg, ParallelConfig(2, r)) for r in range(2)] == [
        v4p.OutputShare(0, 1, 0, 64, True), v4p.OutputShare(1, 1, 0, 64, True)]
    assert [(s.g0, s.c0, s.width, s.whole) for s in (v4p.output_share(cfg, ParallelConfig(4, r)) for r in range(4))] == [
        (0, 0, 32, False), (0, 32, 32, False), (1, 0, 32, False), (1, 32, 32, False)]
    assert [v4p.expert_share(6, ParallelConfig(4, r)) for r in range(4)] == [(0, 1), (1, 2), (3, 1), (4, 2)]
    with pytest.raises(ConfigError, match="num_attention_heads=4 is not divisible by --tensor-parallel-size 3"):
        v4p.check(cfg, ParallelConfig(3, 0))
    with pytest.raises(ConfigError, match="n_routed_experts=6 is fewer than --tensor-parallel-size 8"):
        v4p.check(tiny_deepseek_v4_config(num_attention_heads=8, moe_intermediate_size=64), ParallelConfig(8, 0))


def test_release_names_expert_skip_rename_and_scale_refusal():
    cfg = get_family("deepseek-v4").size("debug")
    p = ParallelConfig(2, 1)  # experts 3..5, heads 2..3
    rule = v4p.tensor_rule
    assert rule("layers.0.ffn.experts.1.w1.weight", cfg, p).skip
    assert rule("layers.0.ffn.experts.4.w2.weight", cfg, p).rename == "layers.0.ffn.experts.1.w2.weight"
    assert rule("layers.0.ffn.experts.4.w2.scale", cfg, p).rename == "layers.0.ffn.experts.1.w2.scale"
    assert rule("layers.0.attn.wq_b.weight", cfg, p) == rule("model.layers.0.self_attn.q_b_proj.weight", cfg, p)
    assert rule("layers.0.attn.attn_sink", cfg, p).start == 2
    assert rule("layers.0.hc_attn_scale", cfg, p).count is None  # a plain parameter named .scale: whole
    assert rule("embed.weight", cfg, p).start == 160 and rule("head.weight", cfg, p).count == 160
    with pytest.raises(ConfigError, match="block scales of quantized 'layers.0.attn.wo_b.scale'"):
        rule("layers.0.attn.wo_b.scale", cfg, p)


def test_plan_parallel_v4_flash_at_tp8(capsys):
    from torchinferno.cli.main import main

    assert main(["plan-parallel", "--model-kind", "deepseek-v4", "--size", "deepseek-v4-flash", "--tp", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # experts and heads split eightfold; mHC, KV, compressor and indexer replicated
    assert 8 * out["weight_bytes"] / out["full_weight_bytes"] < 1.03
    assert out["all_reduces_per_step"] == 2 * 43 + 1 and out["all_gathers_per_step"] == 1
