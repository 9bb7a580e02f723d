#!/usr/bin/env bash
# Device call (session 22's third; run tool: timeout_s 450, carry [".whl"]):
# 1. profile-offload on CUDA again (benchmarks/device_s19_offload.sh) after its resident-reference fix (the first GPU
#    run compared a CUDA-built random model with the CPU-built one it offloaded).
# 2. bench-moe on the V2-Lite-like model (transformers peer with HF_FLAG=" "), batch 1 and 64 plus the 2048-token prefill, with the
#    session's defaults (router tiles 2 x 2048, the tuned prefill tiles) and the kernel tables moved after the timings.
# 3. probe_ds_prefill.py decode: the per-token expert down kernel's tiles (run 55: 65% of its bytes' time).
source benchmarks/device_env.sh
R="$OUT/s22_b"; mkdir -p "$R"
T_TESTS=${T_TESTS:-90} T_RUN=${T_RUN:-90} bash benchmarks/device_s19_offload.sh
timeout ${T_BENCH:-300} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite ${HF_FLAG:---no-hf} \
  --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v2l.json" > "$R/bench_v2l.log" 2>&1
echo "bench v2l rc=$?" >> "$R/bench_v2l.log"
grep -E "ceilings|module path|model decode|model prefill|transformers|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench_v2l.log" | cut -c1-600
timeout ${T_PROBE:-100} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" decode \
  ${PROBE_VARIANTS:-step,step_down_8x2048,step_down_2x2048,step_down_4x512,step_down_8x512} > "$R/probe.log" 2>&1
echo "probe rc=$?" >> "$R/probe.log"; grep -E "^decode|rc=|Error" "$R/probe.log" | cut -c1-260
mkdir -p "$OUT/s19_offload"; tar -C "$OUT" -czf "$OUT/s22_b.tgz" s22_b s19_offload && rm -rf "$R" "$OUT/s19_offload"
true
