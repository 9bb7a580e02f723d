"""pipeline-v0: layers in stages on spawned gloo ranks (activations sent at stage boundaries) == one device."""

import json

import pytest

from torchinferno.cli.main import main
from torchinferno.errors import ConfigError
from torchinferno.models.registry import get_family
from torchinferno.parallel.pipeline import stage_range, tensor_rule


def test_pipeline_v0_of_every_family_matches_v0(tmp_path, capsys):
    out = tmp_path / "pp.json"
    assert main(["validate-model-variants", "--include-tensor-parallel", "--variant", "pipeline-v0", "--rtol", "1e-5",
                 "--json-output", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert {r["family"] for r in rows} == {"llama3", "deepseek-v3.2", "dsv4", "deepseek-v4"}
    assert all(r["ok"] and r["pipeline_parallel"] == 2 and r["rel_err"] <= 1e-5 for r in rows)
    assert "4/4 variants match v0" in capsys.readouterr().out


def test_stages_and_their_tensors():
    assert [stage_range(5, 2, r) for r in range(2)] == [(0, 3), (3, 5)]
    with pytest.raises(ConfigError, match="num_hidden_layers=2 is fewer than --pipeline-parallel-size 3"):
        stage_range(2, 3, 0)
    cfg = get_family("llama3").size("debug")  # 2 layers
    assert tensor_rule("model.layers.1.mlp.down_proj.weight", cfg, 2, 1).rename == "model.layers.0.mlp.down_proj.weight"
    assert tensor_rule("model.layers.0.mlp.down_proj.weight", cfg, 2, 1).skip
    assert tensor_rule("model.embed_tokens.weight", cfg, 2, 1).count is None  # replicated


@pytest.mark.parametrize("kind", ["deepseek-v3.2", "deepseek-v4"])
def test_llm_in_two_pipeline_stages_equals_one_device(kind):
    """The engine (paged KV per stage, prefix hit, greedy and seeded sampling) on 2 stage processes == 1 device;
    deepseek-v4's stages hand over the mHC streams, and each stage's cache holds its own layer types."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.assembly import ModelSpec
    from torchinferno.engine.llm import LLM

    spec = ModelSpec(model_kind=kind, dtype="float32", prepack=False)  # 3 / 4 layers: stages of 2 and 1 / 2 and 2
    prompts = [[5, 17, 99, 3, 250, 42], [7, 128, 64], [5, 17, 99, 3, 250, 42, 8, 9]]
    params = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.9, seed=4, ignore_eos=True),
              SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)]

    def run(llm):
        return llm.generate(prompts[:2], params[:2], use_tqdm=False) + llm.generate(prompts[2:], params[2:], use_tqdm=False)

    want = [o.token_ids for o in run(LLM(spec, block_size=4, num_gpu_blocks=64))]
    llm = LLM(spec, block_size=4, num_gpu_blocks=64, pipeline_parallel_size=2)
    try:
        got = run(llm)
        assert [o.token_ids for o in got] == want and got[2].num_cached_tokens == 4
        assert "pipeline-parallel 2 ranks (gloo)" in llm.engine.core.describe()
    finally:
        llm.shutdown()
