#!/usr/bin/env bash
# Device call (issue 24, session 19, third; run tool: timeout_s 420, carry [".whl"]): after run 52.
# 1. MLA decode CUDA tests (the GQA baseline's fp32 tiles now 16 rows: run 52's fp32 case ran out of shared memory).
# 2. bench-moe v3-scaled fp8-block, batch 1 and 64: decode block-FP8 linears now quantize in a separate launch
#    (run 52: the in-GEMM quantizer doubled the M=1 GEMM); run 52: batch 1 2.75 ms (53.5%), batch 64 13.24 ms.
# 3. probe_ds_prefill.py decode: the V2-Lite-like step with the MLA kernel at the 128-row split plan vs the GQA kernel.
# 4. probe_fp8_block.py accuracy (issue 24 deliverable 3): V2-Lite-like logits bf16 vs fp8-block, greedy divergence. T_ACC.
source benchmarks/device_env.sh
R="$OUT/s19_c"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_TESTS:-100} python3 -m pytest tests/kernels/test_mla_decode.py -k "paged_decode_cuda" \
  -p no:cacheprovider --timeout 90 --tb=short -rfE -q -o addopts="" > "$R/tests.log" 2>&1; echo "tests rc=$?" >> "$R/tests.log"
grep -E "^(FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -12
LAYERS=${LAYERS:-$(python3 -c "import torch; f = torch.cuda.mem_get_info()[0] / 1e9; print(8 if f > 125 else 4)")}
timeout ${T_BENCH:-120} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v3-scaled \
  --quantization fp8-block --layers "$LAYERS" --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench.json" \
  > "$R/bench.log" 2>&1; echo "bench rc=$?" >> "$R/bench.log"
grep -E "ceilings|model \(|model decode|model prefill|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench.log" | cut -c1-400
[[ ${STAGES:-all} == all ]] || { true; exit 0; }  # STAGES=short: tests and bench only
timeout ${T_PROBE:-70} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" decode > "$R/probe.log" 2>&1
echo "probe rc=$?" >> "$R/probe.log"; grep -E "^decode|rc=|Error" "$R/probe.log" | cut -c1-260
timeout ${T_ACC:-100} python3 benchmarks/probe_fp8_block.py "$R/accuracy.json" accuracy > "$R/accuracy.log" 2>&1
echo "accuracy rc=$?" >> "$R/accuracy.log"; grep -E "^accuracy|Error|rc=" "$R/accuracy.log" | cut -c1-300
true
