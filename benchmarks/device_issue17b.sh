#!/usr/bin/env bash
# Device call (issues 17 + 16): Helion on CUDA, serve vs LLM.generate with the engine step log, LLM defaults vs tuned
# on offline 1k/1k. Run from the repo root on the GPU machine with the .whl folder carried (device README).
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
if [[ ${STAGES:-helion,serve,offline} == *helion* ]]; then
  timeout ${T_HELION:-120} python3 -m pytest tests/workbench/test_workbench_helion.py -p no:cacheprovider -rA -q 2>&1 \
    | grep -v DEBUG > "$OUT/helion.log"; grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$OUT/helion.log" | tail -20
fi
if [[ ${STAGES:-helion,serve,offline} == *serve* ]]; then
  timeout ${T_BENCH:-300} python3 benchmarks/serve_vs_offline.py --json-output "$OUT/serve_vs_offline.json" \
    --server-log "$OUT/server.log" --serve-variants "--step-log $OUT/steps.jsonl" 2>&1 | tee "$OUT/bench.log" | tail -7
  gzip -f "$OUT/steps.jsonl" 2>/dev/null
fi
if [[ ${STAGES:-helion,serve,offline} == *offline* ]]; then
  timeout ${T_OFFLINE:-240} python3 benchmarks/offline_tuning.py --json-output "$OUT/offline_tuning.json" 2>&1 \
    | tee "$OUT/offline.log" | tail -8
fi
true
