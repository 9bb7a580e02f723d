"""make_fx capture: stable node ids, module paths, parameter names, real vs fake, determinism."""

import json

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.graph.capture import NODE_ID, module_path, trace_with_make_fx
from torchinferno.graph.model_forward import prefill_forward, trace_prefill
from torchinferno.graph.node_table import graph_json, graph_signature


def test_ids_modules_and_params(traced_llama):
    model, gm, inputs = traced_llama
    nodes = list(gm.graph.nodes)
    assert [n.meta[NODE_ID] for n in nodes] == list(range(len(nodes)))
    paths = {module_path(n) for n in nodes}
    assert {"model.layers.0.self_attn", "model.layers.1.mlp", "model.embed_tokens"} <= paths
    params = {n.meta.get("ti_param_name") for n in nodes if n.op == "get_attr"}
    assert "model.layers.0.mlp.gate_up_proj.weight" in params and "lm_head.weight" in params
    with torch.no_grad():
        assert torch.equal(gm(*inputs.args), prefill_forward(model, inputs)(*inputs.args))


def test_graph_json_records_edges(traced_llama):
    _, gm, _ = traced_llama
    data = json.loads(json.dumps(graph_json(gm)))
    recs = {r["id"]: r for r in data["nodes"]}
    assert data["num_nodes"] == len(recs)
    for r in recs.values():
        for u in r["users"]:
            assert r["id"] in recs[u]["inputs"]
    mm = [r for r in recs.values() if r["target"] == "aten.mm.default"]
    assert mm and all(r["shapes"] and r["dtypes"] == ["torch.float32"] for r in mm)


def test_retrace_and_fake_trace_are_deterministic(traced_llama):
    model, gm, inputs = traced_llama
    again, _ = trace_prefill(model, inputs.prompts)
    fake, _ = trace_prefill(model, inputs.prompts, fake=True)
    assert graph_signature(again) == graph_signature(gm) == graph_signature(fake)
    vals = [n.meta["val"] for n in fake.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert any(type(v).__name__ == "FakeTensor" for v in vals)


def test_fake_trace_of_data_dependent_code_is_a_config_error():
    def f(x):
        return x[: int(x.sum().item())]

    with pytest.raises(ConfigError, match="data-dependent"):
        trace_with_make_fx(f, (torch.ones(3),), fake=True)


@pytest.mark.parametrize("kind", ["dsv4", "deepseek", "llama3"])
def test_fake_trace_of_every_family_is_a_correct_program(kind):
    """MoE routing is data: under FakeTensors the experts take their routing-independent form, so the
    fake-traced graph, run on real inputs, equals the eager forward."""
    from torchinferno.testing import tiny_model

    model = tiny_model(kind)
    gm, inputs = trace_prefill(model, [[5, 17, 99, 3], [1, 2, 3, 4]], fake=True)
    vals = [n.meta["val"] for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert vals and all(type(v).__name__ == "FakeTensor" for v in vals)
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs.args), prefill_forward(model, inputs)(*inputs.args), rtol=1e-5, atol=1e-5)


def test_trace_smoke_cli(capsys):
    from torchinferno.cli.main import main

    assert main(["trace-smoke", "--fake", "--tokens", "4"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["mode"] == "fake" and out["nodes"] > 50


@pytest.mark.parametrize("extra", [[], ["--tokens", "2"], ["--tokens", "2", "--fake", "--print-graph"]])
def test_trace_smoke_readme_lines(extra, capsys):
    """README: ``trace-smoke --device cpu [--tokens 2 [--fake --print-graph]]`` traces DSv4 by default."""
    from torchinferno.cli.main import main

    assert main(["trace-smoke", "--device", "cpu", *extra]) == 0
    text = capsys.readouterr().out
    out = json.loads(text.strip().splitlines()[-1])
    assert out["family"] == "dsv4" and out["device"] == "cpu" and out["attention_nodes"] > 0
    assert out["mode"] == ("fake" if "--fake" in extra else "real")
    if "--print-graph" in extra:
        assert "class " in text and "torch.ops.aten" in text
    else:
        assert out["max_abs_diff_vs_eager"] <= 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_trace_smoke_cuda_refused_in_one_line(capsys):
    from torchinferno.cli.main import main

    assert main(["trace-smoke", "--device", "cuda"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA is not available" in err[0]
