#!/usr/bin/env bash
# Device call of session 27 (run tool: timeout_s 600, carry [".whl"]). Most important first:
# (1) the CUDA tests of the decode and prefill graph runners (session 26 moved decode capture onto the shared loop
#     untested on a GPU);
# (2) issue 21: three servings of the 8B shape with --step-log, each benched closed-loop at C 1/16/64/256 and open-loop
#     at Poisson 8 and 32 requests/s: A and B identical (lone graph prefill steps, the default), C with
#     --no-graph-prefill-alone. A vs C measures what the scheduler change does; the simulator calibrated on A predicts
#     B (and back) and C (its scheduling taken from C's step log). Analysis on CPU afterwards:
#       tar -xzf sim21.tgz && PYTHONPATH=src python3 benchmarks/sim_offline_validate.py sim21 --json-output off.json
# The DeepSeek benches of issue 24 are device_s26_a.sh (T_HOST=1 T_TUNE=1: without its host probe and tuning).
source benchmarks/device_env.sh
R="$OUT/s27_a"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
logged "$R/tests.log" ${T_TESTS:-90} python3 -m pytest -q -o addopts="" -m cuda tests/kernels/test_cuda_graphs.py \
  tests/kernels/test_cuda_graphs_prefill.py tests/engine/test_graph_runner.py
tail -3 "$R/tests.log"
timeout ${T_SIM:-420} python3 benchmarks/served_sim_validate.py --device cuda --out "$OUT/sim21" --skip-analysis \
  --runs ${RUNS:-a b c} --concurrency ${CONC-1 16 64 256} --request-rates 8 32 --rate-requests 120 2>&1 | tee "$R/sim21.log" | grep -E "^\[|Error|error" | tail -40
gzip -f "$OUT"/sim21/steps_*.jsonl 2>/dev/null
tar -C "$OUT" -czf "$OUT/sim21.tgz" sim21 && rm -rf "$OUT/sim21"
# (3) issue 24 in what is left of a 600 s call: bench-moe on the V2-Lite-like model, transformers eager beside it
LEFT=$(( ${CALL_S:-570} - SECONDS ))
if [ "$LEFT" -gt 150 ]; then
  logged "$R/bench_v2l.log" "$LEFT" python3 -m torchinferno.cli.main bench-moe --sections model --model-shape v2-lite \
    --batches 1 8 64 256 --prefill-tokens 2048 --json-output "$R/bench_v2l.json"
  grep -E "ceilings|model decode|model prefill|transformers|rc=|Error" "$R/bench_v2l.log" | cut -c1-400
fi
true
