#!/usr/bin/env bash
# Device call 1 of session 17: the session-16 GPU code that never ran, most valuable first (about 9 minutes).
#   bash benchmarks/device_s17a.sh        (run tool: timeout_s 590)
# 1. benchmarks/probe_ds_prefill.py mla,prefill,decode (issue 24: where the V2-Lite-like prefill's host time goes,
#    MLA decode split sweep, graph decode with a smaller minimum split)           cap T_PROBE (200 s)
# 2. the V4 prefill kernel's CUDA tests (device_s16_v4pre.sh STAGES=tests)         cap T_TESTS (150 s)
# 3. the block-FP8 CUDA tests (device_s16_fp8b.sh STAGES=tests)                    cap T_FP8 (120 s)
# 4. the V4 prefill timing vs torch (device_s16_v4pre.sh STAGES=bench)             cap T_BENCH (100 s)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/p"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
PYTHONPATH=src timeout ${T_PROBE:-200} python3 benchmarks/probe_ds_prefill.py "$OUT/p/probe.json" mla,prefill,decode \
  > "$OUT/p/probe.log" 2>&1; echo "probe rc=$?" >> "$OUT/p/probe.log"
echo "== probe"; grep -vE "^\s*$" "$OUT/p/probe.log" | tail -40 | cut -c1-400
STAGES=tests T_TESTS=${T_TESTS:-150} bash benchmarks/device_s16_v4pre.sh; mv "$OUT/s16_v4pre.tar.gz" "$OUT/s16_v4pre_tests.tar.gz"
STAGES=tests T_TESTS=${T_FP8:-120} bash benchmarks/device_s16_fp8b.sh
STAGES=bench T_BENCH=${T_BENCH:-100} bash benchmarks/device_s16_v4pre.sh
true
