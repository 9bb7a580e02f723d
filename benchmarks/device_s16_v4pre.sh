#!/usr/bin/env bash
# Device call (issue 22, session 16): DeepSeek-V4 PREFILL attention through the Triton sparse-sink kernel
# (kernels/sparse_sink_prefill.py: the decode kernel with one row per query, per-query window + selected-entry slot
# lists; logits rounded as the torch _attend). Stages:
#   tests  the CUDA tests of the new kernel (kernel == torch at fp32 / bf16 incl. V4-Flash's 64x512 shape, sabotage
#          controls, tiny V4 prefill logits fresh + chunked with the kernel == without) and the existing V4 CUDA tests
#          it touches (sparse-sink decode, graph decode == eager through LLM, the engine's chunked prefill with the
#          sliding pool == generate: their prefills now run the kernel);
#   bench  benchmarks/v4_gpu_bench.py prefill: kernel vs torch _attend at V4-Flash's attention shape (H=64, hd=512,
#          window 128), fresh prompts Q = 512 / 2048 / 4096, sliding-only, CSA (top-512 of Q/4) and HCA (Q/128):
#          ms, peak MiB above the inputs (torch OOM caught and reported), error vs a chunked fp32 oracle; a tile sweep
#          at Q=4096 CSA; the small random V4's whole prefill (2048 tokens, bf16) with the kernel on / off.
# About 2-3 minutes on one H100/H200 (tests ~60-120 s, mostly Triton compiles; bench ~60 s; capped at 180 + 140 s).
# Carry .whl (msgspec etc., for the engine test) if available; it is installed when present. Everything lands in $OUT/s16_v4pre.tar.gz; the summary is printed.
#   bash benchmarks/device_s16_v4pre.sh          (run tool: timeout_s 360)
source benchmarks/device_env.sh
R="$OUT/s16_v4pre"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv > "$R/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
if [[ ${STAGES:-tests,bench} == *tests* ]]; then
  timeout ${T_TESTS:-180} python3 -m pytest tests/kernels/test_sparse_sink_prefill.py tests/kernels/test_sparse_sink_decode.py \
    tests/engine/test_kv_cache_groups.py -k "cuda" -p no:cacheprovider -rA -q > "$R/tests.log" 2>&1
  echo "tests rc=$?" >> "$R/tests.log"
fi
if [[ ${STAGES:-tests,bench} == *bench* ]]; then
  timeout ${T_BENCH:-140} python3 benchmarks/v4_gpu_bench.py "$R/bench" prefill > "$R/bench.log" 2>&1
  echo "bench rc=$?" >> "$R/bench.log"
fi
echo "== s16_v4pre summary ($(cat "$R/commit.txt" 2>/dev/null))"
grep -E "^(torch|NVIDIA|name)" "$R/env.txt" | head -3
[[ -f "$R/tests.log" ]] && { grep -E "^(PASSED|FAILED|ERROR|SKIPPED)" "$R/tests.log" | cut -c1-250 | head -20
  grep -E "passed|failed|rc=" "$R/tests.log" | tail -2; }
[[ -f "$R/bench.log" ]] && grep -E "^(device|prefill)|FAILED|Error|rc=" "$R/bench.log" | cut -c1-400
tar -czf "$OUT/s16_v4pre.tar.gz" -C "$OUT" s16_v4pre && rm -rf "$R"
true
