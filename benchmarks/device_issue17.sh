#!/usr/bin/env bash
# One device call for issue 17 (+ CUDA checks of this session's changes). Run from the repo root on the GPU machine.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
timeout ${T_BENCH:-330} python3 benchmarks/serve_vs_offline.py --json-output "$OUT/serve_vs_offline.json" \
  --server-log "$OUT/server.log" "$@" 2>&1 | tee "$OUT/bench.log"
CUDA_LAUNCH_BLOCKING=1 timeout ${T_TESTS:-150} python3 -m pytest tests/kernels tests/engine tests/models/test_pretrained_api.py \
  tests/models/test_llama3_oracle.py tests/server/test_engine_failure.py -q -x --tb=short -p no:cacheprovider 2>&1 \
  | grep -v "Assertion .ind" | tee "$OUT/tests.log" | tail -40
timeout ${T_HELION:-60} python3 -m pytest tests/workbench/test_workbench_helion.py -q -p no:cacheprovider -rs 2>&1 | tail -12 | tee "$OUT/helion.log"
