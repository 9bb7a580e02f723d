"""ResearchHarness, research-smoke, and the runtime path staying free of compilers/tracers."""

import json
import os
import subprocess
import sys

import pytest

from torchinferno.cli.main import main
from torchinferno.errors import ConfigError
from torchinferno.workbench.research import ResearchHarness


def test_harness_runs_compares_and_records_failures():
    h = ResearchHarness()
    h.register("a", lambda: {"median_us": 2.0, "err": 0.0})

    @h.register("b", description="decorator form")
    def _b():
        return {"median_us": 1.0, "extra": "x"}

    h.register("boom", lambda: 1 / 0)
    results = h.run()
    assert [r.name for r in results] == ["a", "b", "boom"]
    assert results[2].error.startswith("ZeroDivisionError") and results[0].error is None
    table = ResearchHarness.table(results)
    assert table.splitlines()[0].split()[:4] == ["experiment", "median_us", "err", "extra"]
    assert "ZeroDivisionError" in table
    with pytest.raises(ConfigError, match="already registered"):
        h.register("a", lambda: {})
    with pytest.raises(ConfigError, match="valid: a, b, boom"):
        h.run(["zzz"])


def test_research_smoke_cli(capsys):
    assert main(["research-smoke", "--tokens", "6", "--iters", "2", "--json", "--no-policies"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"eager-forward", "aten-graph", "pattern-fused-rmsnorm-swiglu"}
    assert rows["pattern-fused-rmsnorm-swiglu"]["metrics"]["replaced"] == 2
    assert all(r["metrics"]["max_abs_err"] <= 1e-5 for r in rows.values())


RUNTIME = r"""
import sys, json
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import generate
from torchinferno.engine.llm import LLM
from torchinferno.testing import tiny_model
m = tiny_model("llama3")
a = generate(m, [[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))[0].token_ids
b = LLM(m, block_size=4).generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))[0].token_ids
banned = ("torch._dynamo", "torch._inductor", "torchinferno.graph", "torchinferno.workbench",
          "torchinferno.kernels.custom_ops", "triton", "helion", "torch._functorch.aot_autograd")
print(json.dumps({"same": a == b, "loaded": sorted(k for k in sys.modules if k.startswith(banned))}))
"""


def test_runtime_path_imports_no_compiler_or_graph_tooling():
    # `import torch` itself loads torch.fx, make_fx's proxy_tensor, the subgraph rewriter and torch.export, so those cannot
    # be banned; dynamo, inductor, AOTAutograd and our graph/workbench/custom-op modules can.
    env = {k: v for k, v in os.environ.items() if k != "TORCHINFERNO_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-c", RUNTIME], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["same"] and out["loaded"] == []
