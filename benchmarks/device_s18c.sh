#!/usr/bin/env bash
# Device call 3 of session 18 (run tool: carry [".whl"], timeout_s 480): issue 24's measurement after the MLA plan.
# 1. bench-moe --sections model on the V2-Lite-like shape: decode B = 1 / 8 / 64 / 256 from CUDA graphs + eager, a
#    2048-token prefill, beside transformers eager and the same-run ceilings (copy bandwidth, bf16 matmul). T_BENCH.
# 2. The block-FP8 MoE CUDA test with its tie-aware tolerance (it failed s18b on the max error alone). T_TESTS.
source benchmarks/device_env.sh
R="$OUT/s18c"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout ${T_BENCH:-270} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite \
  --batches 1 8 64 256 --prefill-tokens 2048 --json-output "$R/bench.json" > "$R/bench.log" 2>&1
echo "bench rc=$?" >> "$R/bench.log"
grep -E "ceilings|model \(|launches per layer|model decode|model prefill|kernels [0-9.]+ ms|transformers|skipped|Error|rc=" \
  "$R/bench.log" | cut -c1-330
timeout -s INT ${T_TESTS:-150} python3 -m pytest "tests/kernels/test_fp8_block.py::test_fp8_block_experts_cuda" \
  -p no:cacheprovider --timeout 140 --tb=short -rfEp -q -o addopts="" > "$R/tests.log" 2>&1
echo "tests rc=$?" >> "$R/tests.log"
echo "== tests"; grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -20
true
