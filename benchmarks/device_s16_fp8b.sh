#!/usr/bin/env bash
# Device call (issue 24 deliverable 3, session 16): native block-scaled FP8 weights (--quantization fp8-block).
# 1. CUDA tests of the new kernels (tests/kernels/test_fp8_block.py and tests/engine/test_fp8_block_engine.py
#    -k cuda; the latter: LLM(quantization="fp8-block") on a tiny FP8 checkpoint, engine warm-up and CUDA-graph decode
#    vs the CPU reference path's tokens): the per-token-group quantizer bitwise
#    vs torch, the block GEMM vs the torch reference (fp32/bf16, DeepSeek shapes at M 1/16/300), the block-FP8
#    fused MoE vs its reference and vs the dequantized bf16 experts, a tiny deepseek-v3.2 model Triton == torch,
#    and the FP8 MoE replayed from a CUDA graph.
# 2. benchmarks/probe_fp8_block.py micro,sweep: bf16 F.linear vs fp8-block (quantizer + GEMM) vs per-channel FP8 at
#    M = 1, 16, 128, 2048 on V2-Lite-like and V3 [N, K] shapes (ms, TFLOP/s, GB/s; weights cycled past L2), and a
#    tile sweep of the GEMM on four shapes (what kernels/fp8_block.py M_TILES should hold); probe ... moe: the routed
#    experts alone (V2-Lite-like 64x2048x1408 top-6 and V3 256x7168x2048 top-8) at 1/16/128/2048 tokens, bf16
#    fused MoE vs block-FP8 fused MoE on the same weights.
# 3. probe_fp8_block.py accuracy: the V2-Lite-like model (random bf16, 9.3 B params) logits bf16 vs fp8-block
#    (linears only, then + experts): max/mean abs diff, teacher-forced argmax agreement and free greedy divergence
#    over 32 tokens.
# About 4-5 minutes (tests ~1, micro+sweep+moe ~2, accuracy ~1); carries nothing but the repo.
# Everything lands in $OUT/s16_fp8b.tar.gz; a compact summary is printed at the end.
#   bash benchmarks/device_s16_fp8b.sh          (run tool: timeout_s 480; STAGES=tests,micro,accuracy selects)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src
R="$OUT/s16_fp8b"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv > "$R/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
if [[ ${STAGES:-tests,micro,accuracy} == *tests* ]]; then
  timeout ${T_TESTS:-130} python3 -m pytest tests/kernels/test_fp8_block.py tests/engine/test_fp8_block_engine.py \
    -k cuda -p no:cacheprovider -rA -q \
    > "$R/tests.log" 2>&1
  echo "tests rc=$?" >> "$R/tests.log"
fi
if [[ ${STAGES:-tests,micro,accuracy} == *micro* ]]; then
  timeout ${T_MICRO:-200} python3 benchmarks/probe_fp8_block.py "$R/micro.json" micro,sweep,moe > "$R/micro.log" 2>&1
  echo "micro rc=$?" >> "$R/micro.log"
fi
if [[ ${STAGES:-tests,micro,accuracy} == *accuracy* ]]; then
  timeout ${T_ACC:-110} python3 benchmarks/probe_fp8_block.py "$R/accuracy.json" accuracy > "$R/accuracy.log" 2>&1
  echo "accuracy rc=$?" >> "$R/accuracy.log"
fi
echo "== s16_fp8b summary ($(cat "$R/commit.txt" 2>/dev/null))"
grep -E "^torch|H100|H200" "$R/env.txt"
[[ -f "$R/tests.log" ]] && { grep -E "^(FAILED|ERROR)|Error" "$R/tests.log" | head -12 | cut -c1-300; grep -E "passed|failed|rc=" "$R/tests.log" | tail -2; }
[[ -f "$R/micro.log" ]] && grep -E "ceilings|^micro|^sweep|^moe|Error|rc=" "$R/micro.log" | cut -c1-230
[[ -f "$R/accuracy.log" ]] && grep -E "^accuracy|Error|rc=" "$R/accuracy.log" | cut -c1-300
tar -czf "$OUT/s16_fp8b.tar.gz" -C "$OUT" s16_fp8b && rm -rf "$R"
true
