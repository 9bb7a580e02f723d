#!/usr/bin/env bash
# Device call for the next session (issue 24; run tool: timeout_s 420, carry [".whl"] optional): block-FP8 split-K.
# Session 18 split the K groups of decode-sized block-FP8 GEMMs among programs (kernels.fp8_block.block_config's
# SPLIT_K; second launch sums the fp32 shares): run 47 had the M=1 GEMM at 1.95 of a 4.31 ms V3-shape step.
# 1. CUDA tests of the block-FP8 GEMM (split configs included) and the FP8 model/graph tests. T_TESTS.
# 2. probe_fp8_block.py micro,sweep: split vs unsplit at M = 1 / 16 / 128 / 2048 on DeepSeek shapes. T_PROBE.
# 3. bench-moe v3-scaled fp8-block model section (4 layers on an H100, 8 on an H200): the batch-1 step vs run 47. T_BENCH.
source benchmarks/device_env.sh
R="$OUT/s19_fp8splitk"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_TESTS:-120} python3 -m pytest tests/kernels/test_fp8_block.py -k cuda -p no:cacheprovider \
  --timeout 100 --tb=short -rfEp -q -o addopts="" > "$R/tests.log" 2>&1; echo "tests rc=$?" >> "$R/tests.log"
grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -20
timeout ${T_PROBE:-120} python3 benchmarks/probe_fp8_block.py "$R/probe.json" micro,sweep > "$R/probe.log" 2>&1
echo "probe rc=$?" >> "$R/probe.log"; grep -E "^(micro|sweep)|rc=|Error" "$R/probe.log" | cut -c1-260 | head -60
LAYERS=${LAYERS:-$(python3 -c "import torch; f = torch.cuda.mem_get_info()[0] / 1e9; print(8 if f > 125 else 4)")}
timeout ${T_BENCH:-170} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v3-scaled \
  --quantization fp8-block --layers "$LAYERS" --batches 1 8 64 --prefill-tokens 2048 --json-output "$R/bench.json" \
  > "$R/bench.log" 2>&1; echo "bench rc=$?" >> "$R/bench.log"
grep -E "ceilings|model \(|model decode|model prefill|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench.log" | cut -c1-330
true
