#!/usr/bin/env bash
# Device call (issue 24, session 20; run tool: timeout_s 480, carry [".whl"]).
# 1. CUDA tests: the deepseek-v3 batch-1 decode-GEMV step (models/deepseek_v32/cuda_decode.py) vs the module path,
#    fp32 + bf16, PDL on Hopper; the MLA kernel's CUDA tests (the GQA baseline's fp32 tiles now 16 rows).
# 2. bench-moe v2-lite model, batch 1 and 64: the step (graph-replayed, as the engine runs it) beside the module path
#    at batch 1 in the same run (run 51, module path: 2.08 ms, 50.3% of the bound on an H100).
# 3. bench-moe v3-scaled fp8-block b1/b64 (decode block-FP8 linears quantize in a separate launch; run 52: 2.75 ms).
# 4. probe_fp8_block.py accuracy (issue 24 deliverable 3: fp8-block vs the dequantized bf16 model).
source benchmarks/device_env.sh
R="$OUT/s20_a"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_TESTS:-150} python3 -m pytest tests/kernels/test_mla_decode.py -k "cuda or step" \
  -p no:cacheprovider --timeout 120 --tb=short -rfE -q -o addopts="" > "$R/tests.log" 2>&1; echo "tests rc=$?" >> "$R/tests.log"
grep -E "^(FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | cut -c1-240 | head -14
timeout ${T_V2:-120} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite --no-hf \
  --batches 1 64 --prefill-tokens 0 --json-output "$R/bench_v2l.json" > "$R/bench_v2l.log" 2>&1
echo "bench v2l rc=$?" >> "$R/bench_v2l.log"
grep -E "ceilings|module path|model decode|kernels [0-9.]+ ms|top:|launch|rc=|Error" "$R/bench_v2l.log" | cut -c1-400
LAYERS=${LAYERS:-$(python3 -c "import torch; f = torch.cuda.mem_get_info()[0] / 1e9; print(8 if f > 125 else 4)")}
timeout ${T_BENCH:-100} python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v3-scaled --no-hf \
  --quantization fp8-block --layers "$LAYERS" --batches 1 64 --prefill-tokens 0 --json-output "$R/bench_v3.json" \
  > "$R/bench_v3.log" 2>&1; echo "bench v3 rc=$?" >> "$R/bench_v3.log"
grep -E "model decode|kernels [0-9.]+ ms|rc=|Error" "$R/bench_v3.log" | cut -c1-300
timeout ${T_ACC:-90} python3 benchmarks/probe_fp8_block.py "$R/accuracy.json" accuracy > "$R/accuracy.log" 2>&1
echo "accuracy rc=$?" >> "$R/accuracy.log"; grep -E "^accuracy|Error|rc=" "$R/accuracy.log" | cut -c1-300
tar -C "$OUT" -czf "$OUT/s20_a.tgz" s20_a && rm -rf "$R"
true
