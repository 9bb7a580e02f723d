#!/usr/bin/env bash
# Device call (session 23, first; run tool: timeout_s 480, carry [".whl"]): (1) the batch-1 step with pdl_chain on
# (session 22's unrun device_s22_d.sh: CUDA step tests, then probe decode step / step_pdl_chain / step_no_pdl);
# (2) the CUDA tests of the grouped-GEMM MoE path and the in-place MLA prefill kernel; (3) probe_prefill_moe.py: one MoE layer at 2048 tokens Triton vs
# torch's grouped GEMM, the MLA prefill attention's backends and the Triton in-place kernel, the whole prefill
# with each MoE path and attention kernel.
source benchmarks/device_env.sh
T_STEP=110 T_PROBE=75 bash benchmarks/device_s22_d.sh
R="$OUT/s23_a"; mkdir -p "$R"
timeout 150 python3 -m pytest tests/kernels/test_grouped_mm_moe.py tests/kernels/test_mla_prefill.py -p no:cacheprovider --timeout 140 --tb=short -rfEp \
  -o addopts="" > "$R/gmm_tests.log" 2>&1; echo "grouped_mm tests rc=$?" >> "$R/gmm_tests.log"
grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/gmm_tests.log" | cut -c1-240 | head -12
timeout ${T_PRE:-220} python3 benchmarks/probe_prefill_moe.py "$R/prefill.json" ${PRE_SECTIONS:-moe,attn,model} \
  > "$R/prefill.log" 2>&1; echo "prefill probe rc=$?" >> "$R/prefill.log"
grep -E "^(moe|attn|model|  model prefill|H|NVIDIA)|rc=|Error" "$R/prefill.log" | cut -c1-220
true
