#!/usr/bin/env bash
# Device call 1 of session 17: the session-16 pieces that never ran (V4 prefill kernel, DeepSeek prefill/MLA probe).
#   bash benchmarks/device_s17a.sh        (run tool: timeout_s 560)
# 1. benchmarks/device_s16_v4pre.sh (tests + bench; T_TESTS/T_BENCH caps);
# 2. benchmarks/probe_ds_prefill.py mla,prefill,decode on the V2-Lite-like shape (T_PROBE cap).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T_TESTS=${T_TESTS:-150} T_BENCH=${T_BENCH:-110} bash benchmarks/device_s16_v4pre.sh
mkdir -p "$OUT/p"
PYTHONPATH=src timeout ${T_PROBE:-220} python3 benchmarks/probe_ds_prefill.py "$OUT/p/probe.json" mla,prefill,decode \
  > "$OUT/p/probe.log" 2>&1; echo "probe rc=$?" >> "$OUT/p/probe.log"
echo "== probe"; grep -vE "^\s*$" "$OUT/p/probe.log" | tail -60 | cut -c1-300
true
