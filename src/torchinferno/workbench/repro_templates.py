"""Source text of the generated repro scripts (``repro.py``, ``subgraph_repro.py``, ...).

Every script is standalone: run with ``python <script>`` from any directory, it rebuilds what it
needs, compares with the recorded result and exits 0 on a match (1 otherwise), printing one JSON
line. Every script takes ``--device cpu|cuda|cuda:N`` (default: the recorded device); asking for
CUDA on a host without it prints one ``error:`` line and exits 1 instead of running elsewhere. Run repros need the ``torchinferno`` package (found via the recorded source dir when it is
not installed); graph repros need only ``torch`` (+ TorchInferno's custom ops when the graph
calls ``torch.ops.torchinferno.*``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torchinferno
from torchinferno.workbench.run_config import PAGED_BLOCK_SIZE

_SRC = str(Path(torchinferno.__file__).resolve().parents[1])

_IMPORT_GUARD = f'''try:
    import torchinferno  # noqa: F401
except ImportError:  # not installed: use the source tree this repro was generated from
    sys.path.insert(0, {_SRC!r})
'''

_DEVICE = '''

def device_flag(argv, recorded):
    """The --device to run on (default ``recorded``); CUDA asked for without CUDA: one line, exit 1."""
    import argparse

    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--device", default=recorded, help="cpu | cuda | cuda:N (default: %(default)s)")
    p.add_argument("--iters", type=int, default=0, help="also time N runs (graph repros)")
    a = p.parse_args(argv)
    if not (a.device == "cpu" or a.device.startswith("cuda")):
        sys.exit(f"error: unknown device '{{a.device}}' (valid: cpu, cuda, cuda:N)")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"error: --device {{a.device}} requested but CUDA is not available (valid here: cpu)")
    return a
'''

_RUN = '''#!/usr/bin/env python
"""Repro of a TorchInferno profile-run (generated). Rebuilds the model, regenerates the tokens.

    python repro.py [--device cuda]   # prints {{"match": true, ...}}; exit 0 when they equal output.json's
"""

import json
import sys

{guard}{device}
RUN_CONFIG = {config}
INPUT_IDS = {input_ids}
EXPECTED_TOKEN_IDS = {expected}


def build_model():
    from torchinferno.checkpoint.auto import load_model_auto, resolve_dtype

    c = RUN_CONFIG
    if c["model_kind"] is not None:
        from torchinferno.testing import tiny_model

        return tiny_model(c["model_kind"], size=c["size"], seed=c["seed"], dtype=resolve_dtype(c["dtype"]),
                          variant=c["variant"], device=c["device"])
    return load_model_auto(c["model"], device=c["device"], dtype=c["dtype"], variant=c["variant"])


def generate(model):
    """Greedy, ignore_eos, new_tokens per row on the run's cache backend."""
    from torchinferno.core.sampling_params import SamplingParams

    c = RUN_CONFIG
    params = SamplingParams(max_tokens=c["new_tokens"], temperature=0.0, ignore_eos=True)
    if c["cache_backend"] == "dense":
        from torchinferno.engine.generate import StaticGenerator

        gen = StaticGenerator(model, len(INPUT_IDS), c["prompt_tokens"] + c["new_tokens"])
        return [r.token_ids for r in gen.generate(INPUT_IDS, params)]
    from torchinferno.engine.llm import LLM

    llm = LLM(model, block_size={block_size}, max_num_seqs=len(INPUT_IDS),
              max_model_len=c["prompt_tokens"] + c["new_tokens"], enable_prefix_caching=False)
    return [o.token_ids for o in llm.generate(INPUT_IDS, params)]


def main() -> int:
    RUN_CONFIG["device"] = device_flag(sys.argv[1:], RUN_CONFIG["device"]).device
    tokens = generate(build_model())
    ok = tokens == EXPECTED_TOKEN_IDS
    print(json.dumps({{"match": ok, "token_ids": tokens}}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
'''


def run_repro(config: dict, input_ids: list[list[int]], expected: list[list[int]]) -> str:
    return _RUN.format(guard=_IMPORT_GUARD, device=_DEVICE.format(), config=repr(config), input_ids=json.dumps(input_ids),
                       expected=json.dumps(expected), block_size=PAGED_BLOCK_SIZE)


_GRAPH = '''#!/usr/bin/env python
"""{title} (generated). Runs the standalone graph below on the recorded inputs in
``{tensors}`` and compares with the recorded outputs.

    python {script} [--iters N] [--device cuda]   # one JSON line; exit 0 when max_abs_diff <= tolerance

``--device`` moves constants and inputs there and makes the graph's own allocations (spelled
``device(type=...)`` in the code below) follow it.
"""

import json
import sys
import time
from pathlib import Path

{guard}
{module}

TOLERANCE = {tol!r}
RECORDED_DEVICE = {recorded!r}
{device}

def _flat(v):
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _flat(item)]
    return [v]


def _to(v, dev):
    if isinstance(v, torch.Tensor):
        return v.to(dev)
    if isinstance(v, (list, tuple)):
        return type(v)(_to(x, dev) for x in v)
    if isinstance(v, dict):
        return {{k: _to(x, dev) for k, x in v.items()}}
    return v


def main() -> int:
    args = device_flag(sys.argv[1:], RECORDED_DEVICE)
    dev, iters = torch.device(args.device), args.iters
    globals()["device"] = lambda *a, **k: dev  # the graph's allocations follow --device
    data = torch.load(Path(__file__).resolve().parent / "{tensors}", weights_only=False, map_location="cpu")
    mod = {cls}(_to(data["constants"], dev))
    inputs = _to(data["inputs"], dev)
    with torch.no_grad():
        out = mod(*inputs)
        diff = 0.0
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        for a, e in zip(_flat(outs), _flat(list(data["expected"])), strict=True):
            if isinstance(a, torch.Tensor) and a.numel():
                diff = max(diff, float((a.double().cpu() - e.double()).abs().max()))
        t = None
        if iters:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                mod(*inputs)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = (time.perf_counter() - t0) / iters * 1e6
    ok = diff <= TOLERANCE
    print(json.dumps({{"max_abs_diff": diff, "tolerance": TOLERANCE, "ok": ok, "mean_us": t, "device": str(dev)}}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
'''


def graph_repro(module_source: str, cls: str, script: str, tensors: str, title: str, tol: float,
                recorded_device: str = "cpu") -> str:
    guard = _IMPORT_GUARD if "torchinferno" in module_source else ""
    return _GRAPH.format(title=title, tensors=tensors, script=script, guard=guard, module=module_source, tol=tol, cls=cls,
                         recorded=recorded_device, device=_DEVICE.format())


_CALL = '''#!/usr/bin/env python
"""{title} (generated). Re-runs the experiment through TorchInferno's workbench API with the
recorded arguments and checks the recorded verdict.

    python {script} [--device cuda]   # --device reruns on that device (rebuilds there)
"""

import json
import sys

{guard}{device}
ARGS = {args}


def main() -> int:
    recorded = next((ARGS[k]["device"] for k in ("run_config", "shape") if k in ARGS), "cpu")
    dev = device_flag(sys.argv[1:], recorded).device
    for key in ("run_config", "shape"):  # where the recorded device lives
        if key in ARGS:
            ARGS[key]["device"] = dev
    from {module} import {func}

    result = {func}(**ARGS)
    print(json.dumps(result, default=str))
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
'''


def call_repro(title: str, script: str, module: str, func: str, args: dict) -> str:
    """A repro that calls ``module.func(**args)`` and exits on its ``ok`` field."""
    return _CALL.format(title=title, script=script, guard=_IMPORT_GUARD, device=_DEVICE.format(), args=repr(args),
                        module=module, func=func)


_TIMESLICE = '''#!/usr/bin/env python
"""Repro of a TorchInferno profile-timeslice (generated): replays the time-sliced schedule of the recorded
per-rank work and checks the makespan. Needs only the standard library.

    python timeslice_repro.py [--time-slice-us US] [--context-switch-us US]   # other values: a what-if replay
"""

import argparse
import json
import sys
from collections import deque

WORK_US = {work}
TIME_SLICE_US = {slice_us}
CONTEXT_SWITCH_US = {switch_us}
EXPECTED_MAKESPAN_US = {makespan}

{replay}

def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--time-slice-us", type=float, default=TIME_SLICE_US)
    p.add_argument("--context-switch-us", type=float, default=CONTEXT_SWITCH_US)
    a = p.parse_args()
    _, summary = replay_timeslice(WORK_US, a.time_slice_us, a.context_switch_us)
    same = (a.time_slice_us, a.context_switch_us) == (TIME_SLICE_US, CONTEXT_SWITCH_US)
    match = abs(summary["makespan_us"] - EXPECTED_MAKESPAN_US) <= 1e-6 * max(1.0, EXPECTED_MAKESPAN_US)
    print(json.dumps({{"match": match if same else None, "makespan_us": summary["makespan_us"],
                      "device_busy_fraction": summary["device_busy_fraction"]}}))
    return 0 if match or not same else 1


if __name__ == "__main__":
    sys.exit(main())
'''


def timeslice_repro(work_us: list[float], ts, makespan_us: float, replay_source: str) -> str:
    """A standalone script replaying the time-sliced schedule; ``replay_source``: the replay function's own source
    (``workbench.timeslice.replay_timeslice``), embedded so the script needs nothing of this package."""
    return _TIMESLICE.format(work=repr(list(work_us)), slice_us=repr(ts.time_slice_us),
                             switch_us=repr(ts.context_switch_us), makespan=repr(makespan_us), replay=replay_source)
