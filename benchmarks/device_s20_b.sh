#!/usr/bin/env bash
# Device call (session 20's second, not run: no device started; session 21's first; run tool: timeout_s 560,
# carry [".whl"]).
# 0. The deepseek-v3 decode-GEMV step's CUDA test (fp32 + bf16; q + kv_a in one launch) and the two-weight GEMV's.
# 1. Issue 21 deliverable 6, never run on a GPU: benchmarks/device_s19_offload.sh (profile-offload CUDA tests, the
#    README line on CUDA, its repro script).
# 2. Issue 24: probe_ds_prefill.py decode — the V2-Lite-like batch-1 step from a CUDA graph at context 128 / 1024:
#    module path vs the decode-GEMV step (run s20_a: step 1.94 ms device; the module path's device time not taken
#    there), q + kv_a in one launch or two, PDL off, W_UK / W_UV as head GEMVs or bmms, the MoE's norm / add fused or apart, MLA split floors
#    128 / 64 / 32 rows, and the GQA kernel.
source benchmarks/device_env.sh
R="$OUT/s20_b"; mkdir -p "$R"
# 2 first (session 21: it decides the step's defaults), then 0 and 1
if [[ ${SKIP_PROBE:-0} == 0 ]]; then  # SKIP_PROBE=1: the step test and the offload run only (a short lease)
  timeout ${T_PROBE:-200} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" decode > "$R/probe.log" 2>&1
  echo "probe rc=$?" >> "$R/probe.log"; grep -E "^decode|rc=|Error" "$R/probe.log" | cut -c1-260
fi
# 0. the decode-GEMV step's CUDA test (run s20_a's 150 s cap interrupted it at bf16, after fp32 + PDL passed)
timeout -s INT ${T_STEP:-110} python3 -m pytest tests/kernels/test_mla_decode.py tests/kernels/test_decode_gemv.py \
  -k "gemv_step or two_weights or paged_decode_cuda" -p no:cacheprovider \
  --timeout 110 --tb=short -rfEp -q -o addopts="" > "$R/step_tests.log" 2>&1; echo "step tests rc=$?" >> "$R/step_tests.log"
grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/step_tests.log" | cut -c1-240 | head -8
[[ ${SKIP_OFFLOAD:-0} == 0 ]] && T_TESTS=${T_TESTS:-70} T_RUN=${T_RUN:-80} bash benchmarks/device_s19_offload.sh
mkdir -p "$OUT/s19_offload"
tar -C "$OUT" -czf "$OUT/s20_b.tgz" s20_b s19_offload && rm -rf "$R" "$OUT/s19_offload"
true
