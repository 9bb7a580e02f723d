#!/usr/bin/env bash
# Device call (issue 24, session 21's second; run tool: timeout_s 300, carry [".whl"]): bench-moe on the V2-Lite-like
# model with the step's session-21 defaults (W_UK / W_UV head GEMVs, the MoE's norm and add fused): batch 1 and 64
# graph-replayed beside the bound measured in the same run (the module path's batch 1 beside it), and the 2048-token
# prefill with its kernel table (prefill target: 60% of the matmul rate; run 51: 39%).
source benchmarks/device_env.sh
R="$OUT/s21_b"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout ${T_BENCH:-240} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite --no-hf \
  --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v2l.json" > "$R/bench_v2l.log" 2>&1
echo "bench v2l rc=$?" >> "$R/bench_v2l.log"
grep -E "ceilings|module path|model decode|model prefill|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench_v2l.log" | cut -c1-600
tar -C "$OUT" -czf "$OUT/s21_b.tgz" s21_b && rm -rf "$R"
true
