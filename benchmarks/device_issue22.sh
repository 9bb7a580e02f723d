#!/usr/bin/env bash
# Device call (issue 22 item 4, session 12): the DeepSeek-V4 GPU path on one H200 (torch 2.11). Runs the CUDA tests
# added for it (sparse-sink kernel vs torch reference incl. V4-Flash's 64x512 shape; the tiny V4 decoding from
# captured CUDA graphs == eager, also through LLM; the MLA families' + V4's graph decode == v0), then benchmarks/v4_gpu_bench.py:
# tiny + mid-size random V4 through LLM (eager per-sequence vs static eager vs CUDA graphs: token match, ms/step),
# the Triton kernel vs the torch reference (max error, us), prepare-deepseek-v4-kernels tuned on the GPU and the
# graph decode with the artifact loaded. Under 4 minutes; raw outputs in $OUT/issue22.tar.gz, summary on stdout.
# Run from the repo root on the GPU machine with the .whl folder carried (device README):
#   bash benchmarks/device_issue22.sh
source benchmarks/device_env.sh
R="$OUT/issue22"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv | tee "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
if [[ ${STAGES:-tests,bench} == *tests* ]]; then
  timeout ${T_TESTS:-90} python3 -m pytest tests/kernels/test_sparse_sink_decode.py -k "cuda or graphs" \
    tests/kernels/test_mla_decode.py::test_mla_models_decode_from_cuda_graphs -p no:cacheprovider -rA -q \
    > "$R/tests.log" 2>&1
  grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$R/tests.log" | tail -20
fi
if [[ ${STAGES:-tests,bench} == *bench* ]]; then
  timeout ${T_BENCH:-130} python3 benchmarks/v4_gpu_bench.py "$R" ${BENCH_STAGES:-kernel,models,artifacts} \
    > "$R/bench.log" 2>&1
  tail -40 "$R/bench.log"
fi
tar -czf "$OUT/issue22.tar.gz" -C "$OUT" issue22 && rm -rf "$R"
true
