#!/usr/bin/env bash
# Device call (issue 24, session 19, second; run tool: timeout_s 420, carry [".whl"]): after run 51.
# 1. CUDA tests: MLA decode (fp32 now at 16-row tiles: run 51's fp32 case ran out of shared memory), the block-FP8
#    GEMM with session 18's split-K configs (never run on a GPU). T_TESTS.
# 2. probe_ds_prefill.py mla,decode: the MLA kernel at the two-wave plan and wave-dependent tiles. T_PROBE.
# 3. probe_fp8_block.py micro: split vs unsplit block-FP8 GEMM at M = 1 / 16 / 128 / 2048. T_FP8.
# 4. bench-moe v3-scaled fp8-block (4 layers on an H100, 8 on an H200), batch 1 and 64: vs run 47 (4.56 ms, 32.6%). T_BENCH.
source benchmarks/device_env.sh
R="$OUT/s19_b"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_TESTS:-150} python3 -m pytest tests/kernels/test_mla_decode.py tests/kernels/test_fp8_block.py -k cuda \
  -p no:cacheprovider --timeout 120 --tb=short -rfE -q -o addopts="" > "$R/tests.log" 2>&1; echo "tests rc=$?" >> "$R/tests.log"
grep -E "^(FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -20
timeout ${T_PROBE:-100} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" mla,decode > "$R/probe.log" 2>&1
echo "probe rc=$?" >> "$R/probe.log"; grep -E "^(mla|decode)|rc=|Error" "$R/probe.log" | cut -c1-260 | head -30
timeout ${T_FP8:-80} python3 benchmarks/probe_fp8_block.py "$R/fp8.json" micro > "$R/fp8.log" 2>&1
echo "fp8 rc=$?" >> "$R/fp8.log"; grep -E "^micro|rc=|Error" "$R/fp8.log" | cut -c1-260 | head -30
LAYERS=${LAYERS:-$(python3 -c "import torch; f = torch.cuda.mem_get_info()[0] / 1e9; print(8 if f > 125 else 4)")}
timeout ${T_BENCH:-120} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v3-scaled \
  --quantization fp8-block --layers "$LAYERS" --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench.json" \
  > "$R/bench.log" 2>&1; echo "bench rc=$?" >> "$R/bench.log"
grep -E "ceilings|model \(|model decode|model prefill|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench.log" | cut -c1-400
true
