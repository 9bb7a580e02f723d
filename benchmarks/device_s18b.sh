#!/usr/bin/env bash
# Device call 2 of session 18 (run tool: carry [".whl"], timeout_s 560; run benchmarks/device_wheels.sh here first).
# 1. probe_ds_prefill.py decode,mla: the V2-Lite-like batch-1 / 8 graph decode step with the new MLA launch plan vs
#    the old GQA choice (same caches and tokens), and the split sweep with the plan marked. Capped at T_PROBE.
# 2. The CUDA tests that failed or never ran in s17a / s18a: fused MoE through the models, V4 graphs vs eager
#    through the engine (needs msgspec: the carried wheels), DSA sparse decode, block FP8, the V4 prefill kernel.
#    pytest-timeout caps each test at 150 s; the whole at T_TESTS with SIGINT, so pytest still prints its summary.
source benchmarks/device_env.sh
R="$OUT/s18b"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
git log --oneline -1 | tee -a "$R/env.txt"
timeout ${T_PROBE:-150} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" decode,mla > "$R/probe.log" 2>&1
echo "probe rc=$?" >> "$R/probe.log"
grep -vE "^\s*$|Warning|_warn_once" "$R/probe.log" | tail -20 | cut -c1-300
K=tests/kernels
timeout -s INT ${T_TESTS:-330} python3 -m pytest "$K/test_fused_moe.py::test_fused_moe_models_cuda" \
  "$K/test_sparse_sink_decode.py::test_v4_llm_cuda_graphs_equal_eager" "$K/test_dsa_sparse_decode.py" \
  "$K/test_fp8_block.py" "$K/test_sparse_sink_prefill.py" -k cuda -p no:cacheprovider --timeout 150 --tb=short \
  -rfEp -q -o addopts="" > "$R/tests.log" 2>&1
echo "tests rc=$?" >> "$R/tests.log"
echo "== tests"; grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -50
true
