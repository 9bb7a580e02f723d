"""bench-generate's llama.cpp peer (bench/llamacpp.py): BF16 GGUF copy, finding llama-bench, parsing its JSON.

No llama.cpp build is needed: a stand-in ``llama-bench`` script checks the command line and prints the JSON
shape llama-bench prints; the BF16 copy is checked tensor by tensor against gguf's dequantization.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest

from torchinferno.bench import llamacpp
from torchinferno.errors import ConfigError


def test_bf16_copy_has_the_dequantized_weights_and_the_metadata(tiny_gguf, tmp_path):
    import gguf
    import torch

    dst = llamacpp.write_bf16_gguf(tiny_gguf.path, tmp_path / "tiny.bf16.gguf")
    src, out = gguf.GGUFReader(str(tiny_gguf.path)), gguf.GGUFReader(str(dst))
    assert [t.name for t in out.tensors] == [t.name for t in src.tensors]
    for s, o in zip(src.tensors, out.tensors):
        deq = gguf.quants.dequantize(np.asarray(s.data), s.tensor_type).astype(np.float32)
        if s.tensor_type == gguf.GGMLQuantizationType.F32:
            assert o.tensor_type == s.tensor_type and np.array_equal(np.asarray(o.data), deq), s.name
            continue
        assert o.tensor_type == gguf.GGMLQuantizationType.BF16, s.name
        got = gguf.quants.dequantize(np.asarray(o.data), o.tensor_type)
        want = torch.from_numpy(deq).to(torch.bfloat16).float().numpy()  # bf16 rounding of the same weights
        assert np.array_equal(got.reshape(want.shape), want), s.name
    for key in ("llama.block_count", "tokenizer.ggml.tokens", "tokenizer.chat_template"):
        assert out.fields[key].contents() == src.fields[key].contents(), key
    assert out.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_BF16)
    assert llamacpp.write_bf16_gguf(tiny_gguf.path, dst) == dst  # made once


def _fake_bench(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n"
                    'case "$*" in *"-p 0 -n 16 -t 3"*"-o json"*) ;; *) echo "bad args: $*" >&2; exit 2;; esac\n'
                    f"cat <<'EOF'\n{json.dumps(rows)}\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_finds_llama_bench_under_the_cache_and_parses_its_json(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama-bench on PATH here
    assert llamacpp.find_llama_bench(tmp_path) is None
    binary = _fake_bench(tmp_path / "llama.cpp" / "build" / "bin" / "llama-bench",
                         [{"n_prompt": 0, "n_gen": 16, "avg_ts": 123.5}])
    assert llamacpp.find_llama_bench(tmp_path) == binary
    assert llamacpp.run_llama_bench(binary, tmp_path / "m.gguf", 16, 3) == 123.5
    bad = _fake_bench(tmp_path / "other" / "llama-bench", [{"n_prompt": 512, "n_gen": 0, "avg_ts": 9.0}])
    with pytest.raises(ConfigError, match="no token-generation row"):
        llamacpp.run_llama_bench(bad, tmp_path / "m.gguf", 16, 3)
    with pytest.raises(ConfigError, match="llama-bench failed"):
        llamacpp.run_llama_bench(bad, tmp_path / "m.gguf", 17, 3)


def test_peer_needs_a_gguf_model(tmp_path):
    with pytest.raises(ConfigError, match="needs a GGUF model"):
        llamacpp.model_gguf(str(tmp_path), tmp_path)
