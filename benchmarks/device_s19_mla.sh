#!/usr/bin/env bash
# Device call (issue 24, session 19; run tool: timeout_s 540, carry [".whl"]): the MLA decode kernel
# (kernels/triton/mla_decode_attention.py: each latent row read once as c_kv + k_pe tiles, c_kv reused as the values,
# no spills at the 32-row / 8-warp tiles it had then) against the GQA kernel's MLA plan (576 padded to 1024, 888 bytes spilled).
# 1. CUDA tests: MLA decode (both kernels, FP8 cache, models from graphs), the GQA decode kernels whose split end
#    moved into decode_attention.finish_split (test_triton_kernels / test_cuda_decode_step: Llama's fused step). T_TESTS.
# 2. probe_ds_prefill.py mla,decode: kernel A/B over batch 1/8/64, ctx 128/1024/4096, tiles; the V2-Lite-like model's
#    graph-replayed step with either kernel (run 48: 2.039 ms at B=1 on an H200). T_PROBE.
# 3. bench-moe --sections model (V2-Lite-like, batch 1 8 64, prefill 2048): the figures vs run 49. T_BENCH.
source benchmarks/device_env.sh
R="$OUT/s19_mla"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_TESTS:-150} python3 -m pytest tests/kernels/test_mla_decode.py tests/kernels/test_triton_kernels.py \
  tests/kernels/test_cuda_decode_step.py -k cuda -p no:cacheprovider --timeout 120 --tb=short \
  -rfE -q -o addopts="" > "$R/tests.log" 2>&1; echo "tests rc=$?" >> "$R/tests.log"
grep -E "^(FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -20
timeout ${T_PROBE:-170} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" mla,decode > "$R/probe.log" 2>&1
echo "probe rc=$?" >> "$R/probe.log"; grep -E "^(mla|decode)|rc=|Error" "$R/probe.log" | cut -c1-260 | head -30
timeout ${T_BENCH:-170} python3 -m torchinferno.cli.main bench-moe --sections model --batches 1 8 64 \
  --prefill-tokens 2048 --json-output "$R/bench.json" > "$R/bench.log" 2>&1; echo "bench rc=$?" >> "$R/bench.log"
grep -E "ceilings|model \(|model decode|model prefill|kernels [0-9.]+ ms|top:|rc=|Error" "$R/bench.log" | cut -c1-400
true
