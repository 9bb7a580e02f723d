#!/usr/bin/env bash
# Device call (issue 24, fused MoE + paged MLA decode): the CUDA tests, a tile search written as data, then
# bench-moe (MoE layers at the V2-Lite-like and V3 shapes; the V2-Lite-like model decoding from CUDA graphs vs the
# eager path, the torch MoE and transformers eager; same-run bounds). About 5-6 minutes.
# Run from the repo root on the GPU machine with the .whl folder carried (device README).
# Afterwards: copy $OUT/fused_moe_configs.json to src/torchinferno/kernels/triton/ and commit it.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv | tee "$OUT/env.txt"
if [[ ${STAGES:-tests,tune,bench} == *tests* ]]; then
  # CUDA tests only (the interpreter / CPU checks run in CI): numerics, CUDA-graph capture, engine graphs == eager
  timeout ${T_TESTS:-150} python3 -m pytest tests/kernels/test_fused_moe.py tests/kernels/test_mla_decode.py \
    tests/engine/test_graph_runner.py -k "cuda or graph" -p no:cacheprovider -rA -q > "$OUT/tests.log" 2>&1
  grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$OUT/tests.log" | tail -30
fi
if [[ ${STAGES:-tests,tune,bench} == *tune* ]]; then
  timeout ${T_TUNE:-100} python3 -m torchinferno.cli.main tune-moe --budget-s ${TUNE_BUDGET:-70} \
    --output "$OUT/fused_moe_configs.json" 2>&1 | tee "$OUT/tune.log" | grep -v "skip {" | tail -24
  [[ -s "$OUT/fused_moe_configs.json" ]] && cp "$OUT/fused_moe_configs.json" src/torchinferno/kernels/triton/
fi
if [[ ${STAGES:-tests,tune,bench} == *bench* ]]; then
  timeout ${T_BENCH:-200} python3 -m torchinferno.cli.main bench-moe --json-output "$OUT/bench_moe.json" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -30
fi
true
