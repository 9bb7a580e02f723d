#!/usr/bin/env bash
# Device call 1 of session 17 (about 6.5 minutes; run tool timeout_s 420): the GPU code that never ran, compactly.
# 1. CUDA tests of this and last session's kernels, one pytest (Triton compiles cold: capped at T_TESTS, 170 s):
#    fused MoE (shared tile scheduling, the multi-program sort/pad), the sparse-sink decode (generalized for DSA),
#    DSA sparse decode, the lightning-indexer kernel, block FP8, the V4 prefill sparse-sink kernel. Whatever finishes is reported per test.
# 2. benchmarks/probe_ds_prefill.py mla,prefill,decode (issue 24: the V2-Lite-like prefill's host time by module and
#    op, MLA decode split sweep, graph decode with a smaller minimum split), capped at T_PROBE (200 s).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/s17a"; R="$OUT/s17a"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
git log --oneline -1 | tee -a "$R/env.txt"
PYTHONPATH=src timeout ${T_TESTS:-150} python3 -m pytest tests/kernels/test_fused_moe.py tests/kernels/test_sparse_sink_decode.py \
  tests/kernels/test_dsa_sparse_decode.py tests/kernels/test_indexer_scores.py tests/kernels/test_fp8_block.py \
  tests/kernels/test_sparse_sink_prefill.py -k cuda -p no:cacheprovider -rA -q \
  > "$R/tests.log" 2>&1; echo "tests rc=$?" >> "$R/tests.log"
PYTHONPATH=src timeout ${T_PROBE:-180} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" prefill,decode,mla \
  > "$R/probe.log" 2>&1; echo "probe rc=$?" >> "$R/probe.log"
echo "== tests"; grep -E "^(PASSED|FAILED|ERROR)" "$R/tests.log" | cut -c1-160 | sed 's/tests\/kernels\///' | head -60
grep -E "Error|assert" "$R/tests.log" | head -10 | cut -c1-300; grep -E "passed|failed|rc=" "$R/tests.log" | tail -2
echo "== probe"; grep -vE "^\s*$" "$R/probe.log" | tail -40 | cut -c1-500
true
