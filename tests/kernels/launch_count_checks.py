"""Run by tests/kernels/test_launch_count.py under ``TRITON_INTERPRET=1`` (CPU tensors take the Triton path): the
launches of one decode step of a tiny deepseek-v3 (no query LoRA, as the V2-Lite shape) in fp16 (a half-precision
model as on the GPU, so dtype casts show up) per layer, at batch 1 and batch 4, printed as JSON after
``ok launches`` / ``ok launches_b4``."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    import triton_interpreter_checks  # noqa: F401  (interpreter patches; Triton dispatch accepts CPU tensors)

    from torchinferno.bench.launch_count import decode_step_launches, summary
    from torchinferno.testing import tiny_model

    import torch

    model = tiny_model("deepseek-v3.2", size="debug-v3-no-q-lora", dtype=torch.float16)
    print("ok launches " + json.dumps(summary(decode_step_launches(model, batch=1, ctx=8))))
    print("ok launches_b4 " + json.dumps(summary(decode_step_launches(model, batch=4, ctx=8))))


if __name__ == "__main__":
    main()
