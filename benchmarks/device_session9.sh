#!/usr/bin/env bash
# Device call: CUDA tests of the step-backend refactor and the merged engine, then the simulator calibrated and
# validated on the H200 (issue 21). Run from the repo root on the GPU machine with .whl carried.
source benchmarks/device_env.sh
timeout ${T_TESTS:-200} python3 -m pytest tests/kernels/test_cuda_decode_step.py tests/kernels/test_cuda_graphs.py \
  tests/engine tests/server/test_engine_failure.py -q -x -p no:cacheprovider -n 8 2>&1 | tail -6 | tee "$OUT/tests.log"
M="--model-kind llama3 --size llama3-8b --device cuda --dtype bfloat16 --max-model-len 4096"
timeout ${T_CAL:-200} python3 -m torchinferno.cli.main sim-calibrate $M --out "$OUT/calib_h200_8b.json" \
  --steps-out "$OUT/steps_h200_8b.jsonl" 2>&1 | tail -6 | tee "$OUT/calib.log"
timeout ${T_VAL:-170} python3 -m torchinferno.cli.main sim-validate $M --concurrency 1 16 64 \
  --calibration "$OUT/calib_h200_8b.json" --json-output "$OUT/validate_h200_8b.json" 2>&1 | tail -25 | tee "$OUT/validate.log"
gzip -f "$OUT/steps_h200_8b.jsonl" 2>/dev/null; true
