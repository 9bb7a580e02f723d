#!/usr/bin/env bash
# Device call (issue 21): the simulator against served runs on the H200 — serve twice with --step-log, bench-serve
# at C 1/16/64/256, calibrate from run A's step log, predict run B's results and back, timeline vs linear cost model,
# next to the A-vs-B noise floor (benchmarks/served_sim_validate.py -> sim_offline_validate.py). The step logs now
# record per-step request arrivals. Lead: run with a 540 s timeout; everything lands in $OUT/sim21.tgz. The device
# only serves and benches (--skip-analysis); the comparison runs on CPU afterwards:
#   tar -xzf sim21.tgz && PYTHONPATH=src python3 benchmarks/sim_offline_validate.py sim21 --json-output sim21/offline.json
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
timeout ${T_SIM:-480} python3 benchmarks/served_sim_validate.py --device cuda --out "$OUT/sim21" --skip-analysis 2>&1 \
  | tee "$OUT/sim21.log" | grep -E "^\[|==|mean \||within|C= " | tail -48
gzip -f "$OUT"/sim21/steps_*.jsonl 2>/dev/null
tar -C "$OUT" -czf "$OUT/sim21.tgz" sim21 && rm -rf "$OUT/sim21"  # one file: the device returns a few files only
true
