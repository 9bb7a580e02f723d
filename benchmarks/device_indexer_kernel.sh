#!/usr/bin/env bash
# Device call (indexer_kernel, session 17): the Triton lightning-indexer scores kernel (kernels/indexer_scores.py).
# Runs its CUDA tests (kernel == torch reference at fp32 / bf16 incl. odd sizes, causal limits, exact-zero ties,
# tile independence and sabotage; V4-Flash's indexer shape 64 x 128 top-512 over Q/4 entries, fresh and as a chunk
# over a cached context; V3.2's 64 x 128 top-2048 over Q tokens; the tiny V4 / V3.2 models with the kernel == without),
# then benchmarks/bench_indexer_scores.py: kernel vs torch time and peak memory at Q = 2048 / 4096 / 8192 with S = Q/4
# (V4 CSA) and S = Q (V3.2), bf16 inputs (+ the fp32 IEEE kernel), the stable top-k sort after it for scale, and a
# 6-config tile sweep at Q=4096 of both shapes; also the V4 decode-from-CUDA-graphs and fused MLA decode CUDA tests (the static
# decode's indexer now runs the kernel inside the captured graph). About 2-3 minutes on one H100/H200 (tests ~1-2 min,
# bench ~1 min); carries nothing but the repo.
# Everything lands in $OUT/indexer_kernel.tar.gz; a compact summary is printed at the end.
#   bash benchmarks/device_indexer_kernel.sh          (run tool: timeout_s 360)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src
R="$OUT/indexer_kernel"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv > "$R/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
if [[ ${STAGES:-tests,bench} == *tests* ]]; then
  # + the V4 static decode (its select_entries now scores through the kernel) replayed from CUDA graphs, and the
  # fused V3.2 / V4 decode vs v0 (module + runner)
  timeout ${T_TESTS:-150} python3 -m pytest tests/kernels/test_indexer_scores.py tests/kernels/test_sparse_sink_decode.py \
    tests/kernels/test_mla_decode.py -k "cuda" -p no:cacheprovider -rA -q > "$R/tests.log" 2>&1
  echo "tests rc=$?" >> "$R/tests.log"
fi
if [[ ${STAGES:-tests,bench} == *bench* ]]; then
  timeout ${T_BENCH:-150} python3 benchmarks/bench_indexer_scores.py "$R/bench.json" --sweep > "$R/bench.log" 2>&1
  echo "bench rc=$?" >> "$R/bench.log"
fi
echo "== indexer_kernel summary ($(cat "$R/commit.txt" 2>/dev/null))"
grep -E "^torch" "$R/env.txt"
[[ -f "$R/tests.log" ]] && { grep -E "^(FAILED|ERROR)" "$R/tests.log" | head -12; grep -E "passed|failed|rc=" "$R/tests.log" | tail -2; }
[[ -f "$R/bench.log" ]] && grep -vE "^row " "$R/bench.log" | grep -E "shape|Q ?[0-9]|^sweep|Error|rc=" | cut -c1-300
tar -czf "$OUT/indexer_kernel.tar.gz" -C "$OUT" indexer_kernel && rm -rf "$R"
true
