"""Run by tests/kernels/test_launch_count.py under ``TRITON_INTERPRET=1`` (CPU tensors take the Triton path): the
launches of one batch-1 decode step of a tiny deepseek-v3 (no query LoRA, as the V2-Lite shape) per layer, printed
as JSON after ``ok``."""

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

    model = tiny_model("deepseek-v3.2", size="debug-v3-no-q-lora")
    print("ok launches " + json.dumps(summary(decode_step_launches(model, batch=1, ctx=8))))


if __name__ == "__main__":
    main()
