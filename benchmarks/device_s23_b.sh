#!/usr/bin/env bash
# Device call (session 23's second; run tool: timeout_s 420, carry [".whl"]): bench-moe on the V2-Lite-like model
# with this session's defaults (whatever device_s23_a.sh measured to win: pdl_chain, the grouped-GEMM MoE prefill,
# the in-place MLA prefill kernel), batch 1 and 64 graph-replayed beside the bound, the 2048-token prefill beside the
# matmul rate, transformers eager in the same run (HF_FLAG=--no-hf leaves it out).
source benchmarks/device_env.sh
R="$OUT/s23_b"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout ${T_BENCH:-380} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite ${HF_FLAG:-} \
  --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v2l.json" > "$R/bench_v2l.log" 2>&1
echo "bench v2l rc=$?" >> "$R/bench_v2l.log"
grep -E "ceilings|module path|model decode|model prefill|transformers|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench_v2l.log" | cut -c1-600
true
