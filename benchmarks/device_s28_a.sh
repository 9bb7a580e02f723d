#!/usr/bin/env bash
# Device call of session 28 (run tool: timeout_s 600, carry [".whl"]). Most important first:
# (1) CUDA tests of every graph runner: decode (session 26's shared capture loop), one fresh prompt's prefill, and the
#     new piecewise graphs (kernels.cuda_graphs_piecewise: mixed steps as graphed segments around eager attention);
# (2) probe_piecewise.py: mixed step shapes on the 8B shape, eager vs piecewise wall time and the device floor;
# (3) issue 21: three servings of the 8B shape with --step-log, closed-loop C 1/16/64/256 and Poisson 8 and 32 req/s:
#     A and B identical (defaults), C with --cuda-graph-piecewise-tokens 0 (what the piecewise graphs do under
#     serving). If the piecewise tests failed, every serving runs without them and C is --no-graph-prefill-alone.
#     Analysis on CPU afterwards:
#       tar -xzf sim21.tgz && PYTHONPATH=src python3 benchmarks/sim_offline_validate.py sim21 --json-output off.json
# Ran on an H100 as run 74 (benchmarks/results/run74). Issue 21 still needs it on an H200 (kind nvidia-h200; CONC and
# RUNS as above); the offline analysis takes ~25 min of one CPU core.
source benchmarks/device_env.sh
R="$OUT/s28_a"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
logged "$R/tests.log" ${T_TESTS:-110} python3 -m pytest -q -o addopts="" -m cuda tests/kernels/test_cuda_graphs.py \
  tests/kernels/test_cuda_graphs_prefill.py tests/kernels/test_cuda_graphs_piecewise.py tests/engine/test_graph_runner.py
tail -4 "$R/tests.log"
SERVE="" CFLAGS="--cuda-graph-piecewise-tokens 0"
if grep -qE "FAILED tests/kernels/test_cuda_graphs_piecewise|FAILED tests/engine/test_graph_runner.py::test_graph_engine_equals_enforce_eager_cuda\[" "$R/tests.log" \
   || ! grep -q "rc=0" "$R/tests.log"; then
  echo "piecewise graphs not validated: servings without them"; SERVE="--cuda-graph-piecewise-tokens 0" CFLAGS="--no-graph-prefill-alone"
fi
if [ -z "$SERVE" ]; then
  logged "$R/probe.log" ${T_PROBE:-100} python3 benchmarks/probe_piecewise.py --iters ${PROBE_ITERS:-15} --json-output "$R/probe.json"
  grep -vE "^\s*$" "$R/probe.log" | tail -10 | cut -c1-300
fi
LEFT=$(( ${CALL_S:-575} - SECONDS ))
if [ "$LEFT" -lt 330 ] && [ -z "$RUNS" ]; then  # a short call: the A/C comparison only, fewer levels
  RUNS="a c"; CONC="1 64"
fi
echo "served runs: ${RUNS:-a b c}, $LEFT s left"
timeout $LEFT python3 benchmarks/served_sim_validate.py --device cuda --out "$OUT/sim21" --skip-analysis \
  --runs ${RUNS:-a b c} --concurrency ${CONC-1 16 64 256} --request-rates 8 32 --rate-requests ${RATE_REQ:-120} \
  --serve-flags="$SERVE" --c-flags="$CFLAGS" 2>&1 | tee "$R/sim21.log" | grep -E "^\[|Error|error" | tail -30
gzip -f "$OUT"/sim21/steps_*.jsonl 2>/dev/null
tar -C "$OUT" -czf "$OUT/sim21.tgz" sim21 && rm -rf "$OUT/sim21"
true
