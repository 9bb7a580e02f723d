#!/usr/bin/env bash
# Device call (issue 22 item 2, session 13): DeepSeek-V4's hybrid KV cache on CUDA. The engine's sliding-window pool
# (blocks given back behind the window), the whole-sequence pool with packed per-window entries and the CUDA-graph
# decode runner's second block table: engine tokens == model.generate with graphs + Triton (sparse-sink decode,
# KV append), plus the V4 decode / sparse-sink / cuda-graph tests that run on CUDA. Correctness only (no timing);
# about 1-2 minutes. Everything lands in $OUT/issue22g.tar.gz (the summary on stdout).
# Run from the repo root on the GPU machine with the .whl folder carried (device README):
#   bash benchmarks/device_issue22g.sh
source benchmarks/device_env.sh
R="$OUT/issue22g"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
timeout ${T_TESTS:-240} python3 -m pytest tests/engine/test_kv_cache_groups.py tests/models/test_deepseek_v4_decode.py \
  tests/kernels/test_sparse_sink_decode.py tests/kernels/test_cuda_graphs.py tests/engine/test_deepseek_v4_engine.py \
  -p no:cacheprovider -rA -q > "$R/tests.log" 2>&1
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$R/tests.log" | tail -40
tar -czf "$OUT/issue22g.tar.gz" -C "$OUT" issue22g && rm -rf "$R"
true
