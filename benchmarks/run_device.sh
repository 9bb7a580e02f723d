#!/usr/bin/env bash
# One device call: CUDA kernel tests, perf-smoke (with a tiling sweep), then bench-gpu.
# Usage on the GPU machine (repo root): OUT=/some/dir bash benchmarks/run_device.sh [total s] [stages] [bench-gpu args...]
#   stages: any of "tests perf kvperf bench" (default: tests perf bench)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TOTAL=${1:-570}  # seconds for the whole script; bench-gpu gets what is left
STAGES=${2:-"tests perf bench"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$OUT/env.txt"
if [[ $STAGES == *tests* ]]; then
  timeout 170 python3 -m pytest tests/kernels tests/engine tests/models/test_llama3_oracle.py -q -n 8 -p no:cacheprovider \
    -rs 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [[ $STAGES == *kvperf* ]]; then  # the (d) engine's decode attention shape: bf16 vs FP8 cache
  for kv in auto fp8; do
    timeout 60 python3 -m torchinferno.cli perf-smoke --device cuda --batch 256 --heads 32 --kv-heads 8 --seq-len 1536 \
      --head-dim 128 --iters 10 --kv-cache-dtype $kv 2>&1 | grep -v '^{' | tee -a "$OUT/kvperf.log"
  done
fi
if [[ $STAGES == *" perf"* || $STAGES == perf* ]]; then
  timeout 100 python3 -m torchinferno.cli perf-smoke --device cuda --heads 32 --kv-heads 8 --seq-len 4096 --head-dim 128 \
    --sweep --json-output "$OUT/perf_b1.json" 2>&1 | grep -v '^{' | tee "$OUT/perf.log"
  timeout 40 python3 -m torchinferno.cli perf-smoke --device cuda --batch 64 --heads 32 --kv-heads 8 --seq-len 1024 \
    --head-dim 128 --json-output "$OUT/perf_b64.json" 2>&1 | grep -v '^{' | tee -a "$OUT/perf.log"
  timeout 40 python3 -m torchinferno.cli perf-smoke --device cuda --batch 4 --heads 16 --kv-heads 1 --seq-len 8192 \
    --head-dim 576 --value-dim 512 2>&1 | grep -v '^{' | tee -a "$OUT/perf.log"
fi
if [[ $STAGES == *bench* ]]; then
  BUDGET=$(( TOTAL - SECONDS - 15 ))
  echo "bench-gpu budget ${BUDGET}s"
  timeout $(( BUDGET + 10 )) python3 -m torchinferno.cli bench-gpu --budget-s "$BUDGET" --json-output "$OUT/bench.json" "${@:3}" 2>&1 | grep -v '^{' | tee "$OUT/bench.log"
fi
