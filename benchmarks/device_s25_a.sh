#!/usr/bin/env bash
# Device call (session 25; run tool: timeout_s 600, carry [".whl"]), after device_s23_a.sh chose this session's
# defaults (pdl_chain on, the in-place MLA prefill kernel on CUDA): (1) the CUDA prefill-kernel tests with the
# upper-left sabotage control; (2) tune-moe for the V2-Lite-like experts at prefill token counts, most important
# first (the table had no pair bucket past 4096, so 512-2048 tokens shared one tile: 512 tokens ran 1.6x slower than
# 1024), written into the package's table and copied to $OUT; (3) bench-moe on the V2-Lite-like model with the new
# table: batch 1 and 64 beside the bound, the 2048-token prefill beside the matmul rate, transformers eager in the
# same run.
source benchmarks/device_env.sh
R="$OUT/s25_a"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout ${T_TESTS:-45} python3 -m pytest tests/kernels/test_mla_prefill.py -k cuda -p no:cacheprovider --tb=line -q \
  -o addopts="" > "$R/tests.log" 2>&1; echo "tests rc=$?" >> "$R/tests.log"; tail -4 "$R/tests.log" | cut -c1-240
timeout ${T_TUNE:-190} python3 -m torchinferno.cli.main tune-moe --shape 64,6,2048,1408 \
  --tokens ${TUNE_TOKENS:-2048 512 1024 128 4096} --budget-s ${TUNE_BUDGET:-160} > "$R/tune.log" 2>&1
echo "tune rc=$?" >> "$R/tune.log"; grep -E "best|budget|rc=|Error" "$R/tune.log" | cut -c1-200
cp src/torchinferno/kernels/triton/fused_moe_configs.json "$R/"
timeout ${T_BENCH:-320} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite ${HF_FLAG:-} \
  --batches ${BATCHES:-1 64} --prefill-tokens 2048 --json-output "$R/bench_v2l.json" > "$R/bench_v2l.log" 2>&1
echo "bench v2l rc=$?" >> "$R/bench_v2l.log"
grep -E "ceilings|module path|model decode|model prefill|transformers|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench_v2l.log" | cut -c1-600
true
