#!/usr/bin/env bash
# Device call: batch-invariant mode on CUDA (tests + cost) and the simulator re-calibrated/validated on the H200 with
# the async-scheduling attribution. Run from the repo root on the GPU machine with .whl carried.
source benchmarks/device_env.sh
timeout ${T_BI:-150} python3 -m pytest -p no:cacheprovider -m cuda tests/kernels/test_batch_invariant.py -rA 2>&1 \
  | grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|^E " | head -30 | tee "$OUT/bi_tests.log"
timeout ${T_BIC:-120} python3 benchmarks/batch_invariant_cost.py --model-kind llama3 --model-size llama3-8b --device cuda \
  --json-output "$OUT/batch_invariant_cost.json" 2>&1 | tail -8 | tee "$OUT/bi_cost.log"
M="--model-kind llama3 --size llama3-8b --device cuda --dtype bfloat16 --max-model-len 4096"
timeout ${T_CAL:-120} python3 -m torchinferno.cli.main sim-calibrate $M --out "$OUT/calib_h200_8b.json" \
  --steps-out "$OUT/steps_h200_8b.jsonl" 2>&1 | tail -3 | tee "$OUT/calib.log"
timeout ${T_VAL:-120} python3 -m torchinferno.cli.main sim-validate $M --concurrency 1 16 64 \
  --calibration "$OUT/calib_h200_8b.json" --json-output "$OUT/validate_h200_8b.json" 2>&1 | tail -20 | tee "$OUT/validate.log"
gzip -f "$OUT/steps_h200_8b.jsonl" 2>/dev/null; true
