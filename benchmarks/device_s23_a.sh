#!/usr/bin/env bash
# Device call (session 23, first; run tool: timeout_s 420, carry [".whl"]), most important first (a cut call still
# returns what $OUT holds): (1) the batch-1 step with pdl_chain on (session 22's unrun device_s22_d.sh: CUDA step
# tests, then probe decode step / step_pdl_chain / step_no_pdl); (2) probe_prefill_moe.py moe,attn: one MoE layer at
# 128-2048 tokens, Triton vs torch's grouped GEMM, and the MLA prefill attention (padded SDPA, other backends, the
# in-place Triton kernel); (3) the CUDA tests of the grouped-GEMM MoE path and the in-place MLA prefill kernel;
# (4) the whole 2048-token prefill with today's paths and with both alternatives.
source benchmarks/device_env.sh
T_STEP=${T_STEP:-100} T_PROBE=${T_PROBE:-70} bash benchmarks/device_s22_d.sh
R="$OUT/s23_a"; mkdir -p "$R"
timeout ${T_PARTS:-100} python3 benchmarks/probe_prefill_moe.py "$R/parts.json" moe,attn > "$R/parts.log" 2>&1
echo "parts probe rc=$?" >> "$R/parts.log"; grep -E "^(moe|attn|NVIDIA|H1|H2)|rc=|Error" "$R/parts.log" | cut -c1-200
timeout ${T_TESTS:-120} python3 -m pytest tests/kernels/test_grouped_mm_moe.py tests/kernels/test_mla_prefill.py \
  -p no:cacheprovider --timeout 110 --tb=short -rfEp -o addopts="" > "$R/tests.log" 2>&1
echo "tests rc=$?" >> "$R/tests.log"; grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -14
timeout ${T_MODEL:-130} python3 benchmarks/probe_prefill_moe.py "$R/model.json" model ${MODEL_VARIANTS:-base,both} \
  > "$R/model.log" 2>&1; echo "model probe rc=$?" >> "$R/model.log"
grep -E "^model|  model prefill|rc=|Error|top:" "$R/model.log" | cut -c1-400
true
