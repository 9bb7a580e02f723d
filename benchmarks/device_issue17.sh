#!/usr/bin/env bash
# One device call for issue 17 (+ CUDA checks of this session's changes). Run from the repo root on the GPU machine.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
timeout ${T_BENCH:-330} python3 benchmarks/serve_vs_offline.py --json-output "$OUT/serve_vs_offline.json" \
  --server-log "$OUT/server.log" "$@" 2>&1 | tee "$OUT/bench.log"
CUDA_LAUNCH_BLOCKING=1 timeout ${T_TESTS:-150} python3 -m pytest tests/kernels tests/engine tests/models/test_pretrained_api.py \
  tests/models/test_llama3_oracle.py tests/server/test_engine_failure.py -q -x --tb=short -p no:cacheprovider 2>&1 \
  | grep -v "Assertion .ind" | tee "$OUT/tests.log" | tail -40
timeout ${T_HELION:-60} python3 -m pytest tests/workbench/test_workbench_helion.py -q -p no:cacheprovider -rs 2>&1 | tail -12 | tee "$OUT/helion.log"
