"""deepseek-v4 tensor parallelism (models/deepseek_v4/parallel.py) on spawned gloo ranks == one device.

The tiny V4 (sliding / CSA rate 4 / HCA rate 8 / CSA, window 6, indexer top-3) with its untrained tensors
(sinks, hash table ``tid2eid``, router bias, mHC bases) randomized, so a mis-split sink or a rank routing
differently shows. TP=2 through ``generate``: test_variants_tp.py (tp-v0); here TP=4 (one head per rank, half an
output group each, experts 1/2/1/2) step by step, and the engine at TP=2 reading its slices (and their FP8 block
scales) from a release-format safetensors checkpoint.
"""

import json

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v4 import parallel as v4p
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.model import randomize_untrained_
from torchinferno.models.registry import get_family
from torchinferno.parallel.config import ParallelConfig
from torchinferno.testing import tiny_model

PROMPTS = [[5, 17, 99, 3, 250, 42, 7, 128, 64, 11, 200], [9, 301, 4, 77, 3]]
NEW = 10  # decode positions 11..20 / 5..14: CSA windows close at 7, 11, 15, 19; HCA at 7, 15; the window slides past


def _full():
    return randomize_untrained_(tiny_model("deepseek-v4", variant="v0"), seed=5)


def _steps(model) -> dict:
    """Logits of every greedy generate step (prefill's last tokens, then each cached decode step) and the tokens
    (seeded sampling: the engine test below and tp-v0)."""
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
    return {"logits": seen, "greedy": tokens}


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
        assert out["greedy"] == ref["greedy"], rank
    # one head per rank with its sink; half of output group rank // 2; experts 2/1/2/1; vocab 320 / 4
    s0, s1 = worlds[0]["shapes"], worlds[1]["shapes"]
    assert s0["model.layers.0.self_attn.sinks"] == (1,) and s0["model.layers.0.self_attn.q_b_proj.weight"] == (32, 48)
    assert s0["model.layers.0.self_attn.o_a_proj.weight"] == (24, 32)
    assert s0["model.layers.0.self_attn.o_b_proj.weight"] == (64, 24)
    assert s0["model.layers.0.self_attn.kv_proj.weight"] == (32, 64)  # the shared K=V head: replicated
    assert s0["model.layers.0.mlp.experts.gate_up_proj"][0] == 1 and s1["model.layers.0.mlp.experts.gate_up_proj"][0] == 2
    assert s0["model.layers.0.mlp.shared_experts.down_proj.weight"] == (64, 8)
    assert s0["model.embed_tokens.weight"] == (80, 64)


def _fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 weight, ue8m0 scale [ceil(N/128), ceil(K/128)]): the release's FP8 block format."""
    n, k = w.shape
    bn, bk = -(-n // 128), -(-k // 128)
    pad = torch.zeros(bn * 128, bk * 128)
    pad[:n, :k] = w
    e = torch.ceil(torch.log2(pad.view(bn, 128, bk, 128).abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0))
    s = torch.exp2(e).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return (w / s).to(torch.float8_e4m3fn), (e + 127).to(torch.uint8)


def _quantized_checkpoint(path):
    """A release-format checkpoint: the split dense weights in FP8 with 128x128 block scales (dims 128-aligned:
    2 heads of 128, o_lora_rank 128, shared intermediate 256), routed experts one tensor per expert in MXFP4."""
    from safetensors.torch import save_file

    from torchinferno.checkpoint.quant_v4 import quantize_mxfp4
    from torchinferno.models.deepseek_v4.config import config_to_hf
    from torchinferno.models.deepseek_v4.v0 import DeepSeekV4V0
    from torchinferno.testing import randomize_

    cfg = tiny_deepseek_v4_config(num_attention_heads=2, head_dim=128, o_groups=2, o_lora_rank=128,
                                  moe_intermediate_size=256)
    torch.manual_seed(0)
    model = randomize_untrained_(randomize_(DeepSeekV4V0(cfg)).eval(), seed=5)
    out, inter = {}, cfg.moe_intermediate_size
    for name, t in model.state_dict().items():
        if name.endswith(("q_b_proj.weight", "o_a_proj.weight", "o_b_proj.weight")) or ".shared_experts." in name:
            out[name], out[name.removesuffix("weight") + "scale"] = _fp8(t)
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            prefix = name.rsplit(".", 1)[0]
            for e in range(t.shape[0]):
                parts = ({"gate_proj": t[e, :inter], "up_proj": t[e, inter:]} if name.endswith("gate_up_proj")
                         else {"down_proj": t[e]})
                for piece, w in parts.items():
                    out[f"{prefix}.{e}.{piece}.weight"], out[f"{prefix}.{e}.{piece}.scale"] = quantize_mxfp4(w)
        else:
            out[name] = t
    path.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in out.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config_to_hf(cfg)))
    return path


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    return _quantized_checkpoint(tmp_path_factory.mktemp("v4tp") / "ckpt")


def test_a_rank_reads_its_fp8_slices_with_their_block_scales(quantized):
    """Rank 1 of 2 (fake world, no collectives) from the quantized checkpoint: each parameter is exactly its slice
    of the single-device model's dequantized one."""
    from torchinferno.checkpoint.auto import load_model_auto
    from torchinferno.parallel.fake import fake_world
    from torchinferno.parallel.load import build_rank, shard_checkpoint

    full = load_model_auto(quantized).state_dict()
    fam = get_family("deepseek-v4")
    cfg = fam.config_from_hf(json.loads((quantized / "config.json").read_text()))
    with fake_world(2, rank=1, use_torch=False) as comm:
        rank = build_rank(fam, cfg, comm, lambda rule: shard_checkpoint(quantized, rule)).state_dict()
    a = "model.layers.1.self_attn."
    want = {a + "q_b_proj.weight": full[a + "q_b_proj.weight"][128:], a + "sinks": full[a + "sinks"][1:],
            a + "o_a_proj.weight": full[a + "o_a_proj.weight"][128:], a + "o_b_proj.weight": full[a + "o_b_proj.weight"][:, 128:],
            a + "kv_proj.weight": full[a + "kv_proj.weight"],
            "model.layers.1.mlp.shared_experts.down_proj.weight": full["model.layers.1.mlp.shared_experts.down_proj.weight"][:, 128:],
            "model.layers.1.mlp.experts.down_proj": full["model.layers.1.mlp.experts.down_proj"][3:]}
    for name, w in want.items():
        assert torch.equal(rank[name], w), name
    assert full[a + "q_b_proj.weight"].dtype == torch.float32 and not torch.equal(full[a + "q_b_proj.weight"][128:], full[a + "q_b_proj.weight"][:128])


def test_engine_tp2_reads_its_fp8_slices_and_equals_tp1(quantized):
    """LLM(tensor_parallel_size=2) from an FP8 / MXFP4 release-format checkpoint (each rank reads its row / column
    slices with their block scales, and only its experts): greedy, seeded sampling and a prefix-cache hit."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm import LLM

    ckpt = quantized
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
    with pytest.raises(ConfigError, match="cannot split the 128x128 block scales of quantized 'layers.0.attn.wo_b.scale' at 24"):
        rule("layers.0.attn.wo_b.scale", cfg, p)


def test_plan_parallel_v4_flash_at_tp8(capsys):
    from torchinferno.cli.main import main

    assert main(["plan-parallel", "--model-kind", "deepseek-v4", "--size", "deepseek-v4-flash", "--tp", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # experts and heads split eightfold; mHC, KV, compressor and indexer replicated
    assert 8 * out["weight_bytes"] / out["full_weight_bytes"] < 1.03
    assert out["all_reduces_per_step"] == 2 * 43 + 1 and out["all_gathers_per_step"] == 1
