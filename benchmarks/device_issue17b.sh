#!/usr/bin/env bash
# Device call (issue 17 + 16): serve vs LLM.generate with the engine step log, then the Helion tests on CUDA.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
timeout ${T_HELION:-100} python3 -m pytest tests/workbench/test_workbench_helion.py -q -p no:cacheprovider -rs 2>&1 | tail -15 | tee "$OUT/helion.log"
timeout ${T_BENCH:-420} python3 benchmarks/serve_vs_offline.py --json-output "$OUT/serve_vs_offline.json" \
  --server-log "$OUT/server.log" --serve-variants "--step-log $OUT/steps.jsonl" "$@" 2>&1 | tee "$OUT/bench.log"
gzip -f "$OUT/steps.jsonl" 2>/dev/null; true
