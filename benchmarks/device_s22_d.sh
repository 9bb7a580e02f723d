#!/usr/bin/env bash
# Device call (session 22, last; run tool: timeout_s 200, carry [".whl"]): the deepseek batch-1 step with every kernel (pdl_chain)
# of its chain under PDL (the MLA prologue and attention, the router, the per-token expert kernels): its CUDA tests
# (== the module path, fp32 + bf16, PDL on), then probe_ds_prefill.py decode: the step beside the step without PDL.
source benchmarks/device_env.sh
R="$OUT/s22_d"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_STEP:-110} python3 -m pytest tests/kernels/test_mla_decode.py -k "gemv_step or paged_decode_cuda or cuda_graphs" \
  -p no:cacheprovider --timeout 100 --tb=short -rfEp -o addopts="" > "$R/step_tests.log" 2>&1; echo "step tests rc=$?" >> "$R/step_tests.log"
grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/step_tests.log" | cut -c1-240 | head -12
timeout ${T_PROBE:-70} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" decode ${PROBE_VARIANTS:-step,step_pdl_chain,step_no_pdl} \
  > "$R/probe.log" 2>&1; echo "probe rc=$?" >> "$R/probe.log"; grep -E "^decode|rc=|Error" "$R/probe.log" | cut -c1-200
true
