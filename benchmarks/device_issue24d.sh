#!/usr/bin/env bash
# Device call (issue 24, session 11): the rest of the DeepSeek batch-1 step, prefill. Runs the CUDA tests of what
# changed (fused MoE with the shared experts inside, MLA prologue + decode query buffer, flash-eligible MLA prefill,
# engine graphs == eager), then bench-moe on the V2-Lite-like shape only (MoE layer with the shared-experts A/B;
# the model: batch 1/8/64/256 decode from CUDA graphs, prefill 2048, the batch-1 step's launches per layer,
# transformers eager and the same-run bound). About 4-5 minutes; everything lands in $OUT/issue24d.tar.gz
# (plus the two logs' tails on stdout).
# Run from the repo root on the GPU machine with the .whl folder carried (device README):
#   bash benchmarks/device_issue24d.sh
source benchmarks/device_env.sh
R="$OUT/issue24d"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv | tee "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
if [[ ${STAGES:-tests,bench} == *tests* ]]; then
  timeout ${T_TESTS:-170} python3 -m pytest tests/kernels/test_fused_moe.py tests/kernels/test_mla_decode.py \
    tests/kernels/test_mla_prefill.py tests/engine/test_graph_runner.py -k "cuda or graph" \
    -p no:cacheprovider -rA -q > "$R/tests.log" 2>&1
  grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$R/tests.log" | tail -30
fi
if [[ ${STAGES:-tests,bench} == *bench* ]]; then
  timeout ${T_BENCH:-150} python3 -m torchinferno.cli.main bench-moe --layer-shapes v2-lite \
    --batches 1 8 64 256 --prefill-tokens 2048 --json-output "$R/bench_moe.json" ${BENCH_ARGS:-} \
    2>&1 | tee "$R/bench.log" | tail -30
fi
tar -czf "$OUT/issue24d.tar.gz" -C "$OUT" issue24d && rm -rf "$R"
true
