#!/usr/bin/env bash
# Device call for the next session (issue 21 deliverable 6; run tool: timeout_s 300, carry [".whl"]): profile-offload
# on a GPU, which has never run there (the CPU tests cover tokens; the copy stream and CUDA-event timing do not).
# 1. tests/workbench/test_workbench_offload.py -k cuda: offloaded == resident on CUDA for llama3 / deepseek / dsv4.
# 2. The README line on CUDA at a larger random size (llama3 at the SmolLM2-135M shape, bf16, 128 prompt tokens):
#    offload_summary.json (movement vs compute per iteration, bytes staged) and the repro script's match.
source benchmarks/device_env.sh
R="$OUT/s19_offload"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout -s INT ${T_TESTS:-120} python3 -m pytest tests/workbench/test_workbench_offload.py -k cuda \
  -p no:cacheprovider --timeout 100 --tb=short -rfEp -q -o addopts="" > "$R/tests.log" 2>&1
echo "tests rc=$?" >> "$R/tests.log"; grep -E "^(PASSED|FAILED|ERROR)|^E  |passed|failed|rc=" "$R/tests.log" | head -20
timeout ${T_RUN:-120} python3 -m torchinferno.cli.main profile-offload "$R/llama3-offload-cuda" --model-kind llama3 \
  --size smollm2-135m --device cuda --dtype bfloat16 --batch-size 1 --prompt-tokens 128 --new-tokens 8 --warmup 1 \
  --iters 3 > "$R/run.log" 2>&1; echo "run rc=$?" >> "$R/run.log"; tail -5 "$R/run.log"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print({k: v for k, v in s.items() if not isinstance(v, (list, dict))})" \
  "$R/llama3-offload-cuda/offload_summary.json" 2>&1 | cut -c1-800
timeout ${T_REPRO:-60} python3 "$R/llama3-offload-cuda/offload_repro.py" 2>&1 | tail -1
true
