"""DeepSeek-V4 release checkpoint -> HF-layout safetensors in transformers' in-memory names, streaming.

Reads any spelling ``models/deepseek_v4/weights.py`` reads (public release names, ``save_pretrained`` names),
dequantizes FP8 / MXFP4 pairs (``checkpoint/quant_v4.py``) to ``dtype``, merges per-expert ``w1/w3`` / ``w2`` into
the fused ``experts.gate_up_proj [E, 2I, D]`` / ``experts.down_proj [E, D, I]`` (one layer's experts buffered at a
time), drops ``mtp.*``, checks every name and shape against the config, and writes shards + ``config.json`` +
``torchinferno_conversion_report.json``. Unquantized tensors keep their stored dtype (fp32 mHC / sinks / biases).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from torchinferno.checkpoint import safetensors_io
from torchinferno.checkpoint.quant_v4 import dequantize_stream
from torchinferno.errors import CheckpointError

REPORT_FILE = "torchinferno_conversion_report.json"


def convert_release(src: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16,
                    max_shard_bytes: int = 2 * 1024**3) -> dict:
    from torchinferno.models.deepseek_v4.config import config_from_hf, config_to_hf
    from torchinferno.models.deepseek_v4.weights import (
        _EXPERT,
        _PIECE,
        canonical_name,
        expected_shapes,
    )

    config = config_from_hf(safetensors_io.read_config(src))
    want = expected_shapes(config)
    stored = {n: i.torch_dtype for n, i in safetensors_io.tensor_index(src).items()}
    rep = {"source": str(src), "output": str(out), "dtype": str(dtype).replace("torch.", ""), "dequantized": 0,
           "dropped": [], "tensors_written": 0}
    pending: dict[str, tuple[torch.Tensor, set]] = {}

    def check(name: str, src_name: str, shape: tuple) -> None:
        if name not in want:
            raise CheckpointError(f"unexpected tensor '{src_name}' for deepseek-v4: no parameter with that name")
        if tuple(shape) != want[name]:
            raise CheckpointError(f"shape mismatch for tensor '{src_name}': checkpoint {tuple(shape)}, expects {want[name]}")

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in dequantize_stream(safetensors_io.iter_tensors(src), out_dtype=dtype):
            if stored.get(name) in (torch.float8_e4m3fn, torch.int8, torch.uint8) and t.is_floating_point():
                rep["dequantized"] += 1
            canon = canonical_name(name)
            if canon is None:
                rep["dropped"].append(name)
                continue
            m = _EXPERT.match(canon)
            if m is None:
                check(canon, name, t.shape)
                rep["tensors_written"] += 1
                yield canon, t
                continue
            kind, half = _PIECE[m.group(3)]
            full, e = f"{m.group(1)}.{kind}", int(m.group(2))
            if full not in want or e >= want[full][0]:
                raise CheckpointError(f"unexpected tensor '{name}' for deepseek-v4: no expert {e} in '{full}'")
            buf, got = pending.setdefault(full, (torch.empty(want[full], dtype=t.dtype), set()))
            dst = buf[e] if half is None else buf[e].chunk(2, dim=0)[half]
            if tuple(t.shape) != tuple(dst.shape):
                raise CheckpointError(f"shape mismatch for tensor '{name}': checkpoint {tuple(t.shape)}, expects {tuple(dst.shape)}")
            dst.copy_(t)
            got.add((e, half))
            if len(got) == want[full][0] * (1 if half is None else 2):
                rep["tensors_written"] += 1
                yield full, pending.pop(full)[0]
        if pending:
            full, (_, got) = next(iter(pending.items()))
            raise CheckpointError(f"checkpoint is missing experts of '{full}' ({len(got)} pieces present)")

    out_dir = safetensors_io.save_hf_dir(out, config_to_hf(config), tensors(), max_shard_bytes=max_shard_bytes)
    safetensors_io.write_json(Path(out_dir) / REPORT_FILE, rep)
    return rep
