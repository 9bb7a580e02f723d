#!/usr/bin/env bash
# Device call (session 22's first; run tool: timeout_s 560, carry [".whl"]). Most important first, raw logs under
# $OUT/s22_a (they come back even when the call times out):
# 1. the CUDA tests of session 21's default-on step kernels (W_UK / W_UV head GEMVs, MoE norm/add fused) and the
#    decode-GEMV step (fp32 + bf16), the two-weight GEMV, the MLA kernel: never run on a GPU before.
# 2. tune-moe at the 2048-token prefill's row counts (the grid's new deep / wide tiles; its table lands in this copy's
#    kernels/triton/fused_moe_configs.json, so the bench below runs with it, and comes back as tune.json).
# 3. bench-moe on the V2-Lite-like model with those defaults: batch 1 and 64 graph-replayed beside the bound of the
#    same run, the 2048-token prefill eager / device-only / graph-replayed with its kernel table.
# 4. probe_ds_prefill.py decode: the step's variants (each fusion on/off, MLA split floors, router tiles).
source benchmarks/device_env.sh
R="$OUT/s22_a"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_STEP:-90} python3 -m pytest tests/kernels/test_mla_decode.py tests/kernels/test_decode_gemv.py \
  -k "gemv_step or two_weights or paged_decode_cuda or cuda_graphs" -p no:cacheprovider \
  --timeout 100 --tb=short -rfEp -o addopts="" > "$R/step_tests.log" 2>&1; echo "step tests rc=$?" >> "$R/step_tests.log"
grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/step_tests.log" | cut -c1-240 | head -20
timeout ${T_TUNE:-100} python3 -m torchinferno.cli.main tune-moe --shape 64,6,2048,1408 --tokens 2048 --budget-s 80 \
  > "$R/tune.log" 2>&1; echo "tune rc=$?" >> "$R/tune.log"
cp src/torchinferno/kernels/triton/fused_moe_configs.json "$R/tune.json"; grep -E "T= *2048|rc=" "$R/tune.log" | cut -c1-300
timeout ${T_BENCH:-180} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite --no-hf \
  --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v2l.json" > "$R/bench_v2l.log" 2>&1
echo "bench v2l rc=$?" >> "$R/bench_v2l.log"
grep -E "ceilings|module path|model decode|model prefill|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench_v2l.log" | cut -c1-600
if [[ ${SKIP_PROBE:-0} == 0 ]]; then
  timeout ${T_PROBE:-150} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" decode \
    ${PROBE_VARIANTS:-module,step,step_absorb_bmm,step_moe_ends_apart,step_split64,step_router_4x512} > "$R/probe.log" 2>&1
  echo "probe rc=$?" >> "$R/probe.log"; grep -E "^decode|rc=|Error" "$R/probe.log" | cut -c1-260
fi
tar -C "$OUT" -czf "$OUT/s22_a.tgz" s22_a && rm -rf "$R"
true
