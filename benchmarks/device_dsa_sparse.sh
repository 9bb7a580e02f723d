#!/usr/bin/env bash
# Device call (issue 24, session 17, helper dsa_sparse): V3.2's sparse DSA decode. About 3-4 minutes on one H100/H200
# (Triton compiles cold); carries nothing but the repo.
# 1. CUDA tests (capped at T_TESTS, 170 s): the sparse kernel (values the first 512 of the 576-wide latent row, no
#    sink) vs its reference at V3.2's shape (128 heads, top-k 2048), the tiny V3.2 fused sparse decode == raw dense,
#    graphs-vs-eager through the engine, the indexer reading the paged index-key cache in place == over gathered keys
#    (bitwise); the V4 sparse-sink and the indexer-kernel tests (both kernels changed); the MLA model decode from
#    CUDA graphs (the DSA case now captured).
# 2. benchmarks/bench_dsa_sparse_decode.py (capped at T_BENCH, 150 s): one DSA decode attention step (indexer +
#    top-k + attention) sparse vs dense at 16 / 128 heads, batch 1 / 8, contexts 4k / 16k / 32k, top-k 2048, bf16;
#    the sparse step from a CUDA graph; a tile sweep of the sparse kernel.
# Everything lands in $OUT/dsa_sparse/ and $OUT/dsa_sparse.tar.gz; a compact summary is printed at the end.
#   bash benchmarks/device_dsa_sparse.sh          (run tool: timeout_s 360)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R="$OUT/dsa_sparse"; mkdir -p "$R"
export PYTHONPATH=src
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/env.txt"
git log --oneline -1 >> "$R/env.txt" 2>/dev/null || true
if [[ ${STAGES:-tests,bench} == *tests* ]]; then
  timeout ${T_TESTS:-170} python3 -m pytest tests/kernels/test_dsa_sparse_decode.py tests/kernels/test_sparse_sink_decode.py \
    tests/kernels/test_mla_decode.py tests/kernels/test_indexer_scores.py -k "cuda" -p no:cacheprovider -rA -q \
    > "$R/tests.log" 2>&1
  echo "tests rc=$?" >> "$R/tests.log"
fi
if [[ ${STAGES:-tests,bench} == *bench* ]]; then
  timeout ${T_BENCH:-150} python3 benchmarks/bench_dsa_sparse_decode.py "$R/bench.json" > "$R/bench.log" 2>&1
  echo "bench rc=$?" >> "$R/bench.log"
fi
tar -czf "$OUT/dsa_sparse.tar.gz" -C "$OUT" dsa_sparse 2>/dev/null
echo "== env"; cat "$R/env.txt"
if [[ -f "$R/tests.log" ]]; then
  echo "== tests"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)" "$R/tests.log" | cut -c1-150 | sed 's/tests\/kernels\///' | head -40
  grep -E "Error|assert" "$R/tests.log" | head -10 | cut -c1-300; grep -E "passed|failed|rc=" "$R/tests.log" | tail -2
fi
if [[ -f "$R/bench.log" ]]; then
  echo "== bench (ms per DSA decode attention step; sparse_attn: the kernel + absorption alone)"
  python3 - "$R/bench.log" <<'PY' || tail -20 "$R/bench.log"
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"H{r['H']:<4}B{r['B']:<2}L{r['L']:<6} dense {r.get('dense_ms', float('nan')):7.3f}  sparse {r['sparse_ms']:7.3f}  "
              f"graph {r.get('sparse_graph_ms', float('nan')):7.3f}  indexer+topk {r['indexer_topk_ms']:7.3f}  "
              f"sparse_attn {r['sparse_attn_ms']:7.3f}  err {r.get('rel_err', float('nan')):.1e} "
              f"{r.get('sparse_graph_error', '')}{r.get('dense_error', '')[:60]}")
    elif line.startswith("sweep"):
        print(line.strip()[:160])
    elif "Error" in line or "rc=" in line:
        print(line.strip()[:300])
PY
fi
true
