#!/usr/bin/env bash
# Device call of session 27 (run tool: timeout_s 600, carry [".whl"]; H200 asked, H100 taken). Most important first:
# (1) the CUDA tests of the decode and prefill graph runners (session 26 moved decode capture onto the shared loop
#     untested on a GPU);
# (2) issue 21: the served pair (device_issue21c.sh) with lone graph prefill steps (EngineConfig.graph_prefill_alone):
#     does C 16's TTFT drop from the eager mixed steps, and does the simulator follow;
# (3) issue 24: bench-moe on the V2-Lite-like model with transformers eager, and the V3-shape FP8 model
#     (device_s26_a.sh without its host probe and tuning).
source benchmarks/device_env.sh
R="$OUT/s27_a"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
git rev-parse HEAD 2>/dev/null > "$R/commit.txt"
logged "$R/tests.log" ${T_TESTS:-80} python3 -m pytest -q -o addopts="" -m cuda tests/kernels/test_cuda_graphs.py \
  tests/kernels/test_cuda_graphs_prefill.py tests/engine/test_graph_runner.py
tail -3 "$R/tests.log"
T_SIM=${T_SIM:-300} bash benchmarks/device_issue21c.sh
[ "${T_BENCH:-180}" -gt 1 ] && T_HOST=1 T_TUNE=1 T_BENCH=${T_BENCH:-180} T_V3=${T_V3:-130} bash benchmarks/device_s26_a.sh

# the device returns 8 files at most: everything but the served pair's archive goes into one
tar -C "$OUT" -czf "$OUT/s27_a.tgz" s27_a $( [ -d "$OUT/s26_a" ] && echo s26_a ) && rm -rf "$OUT/s27_a" "$OUT/s26_a"
true
