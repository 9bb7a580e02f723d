"""compile_forward: an explicit torch.compile experiment (eager backend: capture only, fast)."""

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.graph.compile import compile_forward


def test_compile_experiment_reports_error_and_timing():
    def f(x, w):
        return torch.nn.functional.silu(x @ w) * 2

    exp = compile_forward(f, backend="eager")
    rep = exp.run((torch.randn(8, 16), torch.randn(16, 16)), iters=3)
    assert rep.max_abs_diff == 0.0 and rep.compiled_median_us > 0 and rep.eager_median_us > 0
    assert set(rep.to_dict()) >= {"backend", "compile_s", "speedup", "max_abs_diff"}
    with pytest.raises(ConfigError, match="valid: inductor, aot_eager, eager"):
        compile_forward(f, backend="nope")
