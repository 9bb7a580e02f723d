#!/usr/bin/env bash
# Device call (issue 24, session 17): DeepSeek-V3's layer shape in block FP8, built layer by layer
# (kernels/fp8_block_stream.py: never the whole model in bf16; 22.5 GB per MoE layer in bf16, ~11.5 in FP8).
# 1. tests: tests/engine/test_fp8_block_stream.py (CPU: streamed == load-then-quantize bitwise, memory bound, errors;
#    checks this torch) and test_fp8_block_engine.py's CUDA test (LLM(quantization="fp8-block") on a tiny FP8
#    checkpoint, now through the streamed load, Triton kernels + CUDA-graph decode vs the CPU reference).
# 2. bench: bench-moe --sections model --model-shape v3-scaled --quantization fp8-block --layers N (N = 8 on an H200,
#    4 on an H100: picked from free memory; LAYERS=N overrides): the build's time and peak memory
#    (torch.cuda.max_memory_allocated over the build, beside the model's allocated bytes and the largest layer in
#    bf16), then the model section: launches and kernel table of the batch-1 step, decode at batch 1/8/64 (context
#    128) replayed from CUDA graphs + eager, a 2048-token prefill, beside the copy-bandwidth bound and the bf16
#    matmul rate; the torch MoE reference and transformers are skipped at this size (bench-moe says so).
#    STAGES=...,bf16 adds the same section in bf16 at 4 layers (H200) / 3 (H100) for an FP8-vs-bf16 A/B (+~2 min).
# About 4-5 minutes (tests ~1, build ~0.5-1, model section ~2); carries nothing but the repo.
# Everything lands in $OUT/fp8_stream.tar.gz; a compact summary is printed at the end.
#   bash benchmarks/device_fp8_stream.sh          (run tool: timeout_s 540)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src
R="$OUT/fp8_stream"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv > "$R/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
STAGES=${STAGES:-tests,bench}
if [[ $STAGES == *tests* ]]; then
  timeout ${T_TESTS:-150} python3 -m pytest tests/engine/test_fp8_block_stream.py \
    tests/engine/test_fp8_block_engine.py::test_llm_fp8_block_on_cuda -p no:cacheprovider -rA -q > "$R/tests.log" 2>&1
  echo "tests rc=$?" >> "$R/tests.log"
fi
# layers from free memory: FP8 peak ~ 4.6 GB (embedding, head) + 11.5 GB per MoE layer + one bf16 layer (23 GB)
LAYERS=${LAYERS:-$(python3 -c "import torch; f = torch.cuda.mem_get_info()[0] / 1e9; print(8 if f > 125 else 4 if f > 70 else 2)")}
echo "layers $LAYERS (free $(python3 -c "import torch; print(round(torch.cuda.mem_get_info()[0] / 1e9))") GB)" >> "$R/env.txt"
if [[ $STAGES == *bench* ]]; then
  timeout ${T_BENCH:-330} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v3-scaled \
    --quantization fp8-block --layers "$LAYERS" --batches 1 8 64 --prefill-tokens 2048 \
    --json-output "$R/bench_fp8.json" > "$R/bench_fp8.log" 2>&1
  echo "bench rc=$?" >> "$R/bench_fp8.log"
fi
if [[ $STAGES == *bf16* ]]; then
  BF=$([[ $LAYERS -ge 8 ]] && echo 4 || echo 3)
  timeout ${T_BF16:-200} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v3-scaled \
    --layers "$BF" --batches 1 8 64 --prefill-tokens 2048 --no-hf \
    --json-output "$R/bench_bf16.json" > "$R/bench_bf16.log" 2>&1
  echo "bench bf16 rc=$?" >> "$R/bench_bf16.log"
fi
echo "== fp8_stream summary ($(cat "$R/commit.txt" 2>/dev/null))"
grep -E "^torch|H100|H200|^layers" "$R/env.txt"
[[ -f "$R/tests.log" ]] && { grep -E "^(FAILED|ERROR)" "$R/tests.log" | head -12 | cut -c1-300; grep -E "passed|failed|rc=" "$R/tests.log" | tail -2; }
for f in "$R"/bench_fp8.log "$R"/bench_bf16.log; do
  [[ -f "$f" ]] && { echo "-- $(basename "$f")"; grep -E "ceilings|model \(|layer-by-layer|skipped|launches per layer|model decode|model prefill|kernels [0-9.]+ ms|Error|rc=" "$f" | cut -c1-330; }
done
[[ -f "$R/bench_fp8.json" ]] && python3 - "$R/bench_fp8.json" <<'EOF'
import json, sys
b = json.load(open(sys.argv[1])).get("build", {})
s = b.get("stream", {})
if s:
    g = 1e9
    print(f"build {b['seconds']:.1f} s: cuda peak {s['cuda_peak_bytes'] / g:.1f} GB, model {b['allocated'] / g:.1f} GB, "
          f"peak - model {(s['cuda_peak_bytes'] - b['allocated']) / g:.1f} GB vs largest bf16 layer "
          f"{s['max_piece_bytes'] / g:.1f} GB; whole model in bf16 would be {s['total_piece_bytes'] / g:.1f} GB; "
          f"float alive peak {s['peak_float_bytes'] / g:.1f} GB, final {s['final_float_bytes'] / g:.1f} GB")
EOF
tar -czf "$OUT/fp8_stream.tar.gz" -C "$OUT" fp8_stream && rm -rf "$R"
true
