#!/usr/bin/env bash
# Device call for session 30's whole-step mixed graphs (run tool: timeout_s 600, carry [".whl"]; written in session
# 30, when no device was lent: not run yet). Most important first:
# (1) CUDA tests of the graph runners, the new whole-step one included (kernels.cuda_graphs_mixed: a mixed step's whole
#     forward in one graph per token bucket, attention inside on graph-padded metadata; engine tokens == eager);
# (2) probe_piecewise.py on the 8B shape: each mixed step shape eager vs piecewise vs full (and full-tiles: decode rows
#     on whole query tiles, the kernel path before its one-token-query rows), wall and device time;
# (3) served A / C: A the defaults (piecewise), C --cuda-graph-mixed-mode full, closed-loop C 1/16/64/256 and Poisson
#     8 and 32 req/s with step logs: what the full graphs do for TTFT/TPOT under serving (mixed-step launch in the logs).
#     On an H200 (kind nvidia-h200) the A run is also issue 21's H200 serving; add B (RUNS="a b c") when time allows.
#     Analysis on CPU afterwards: tar -xzf sim21.tgz; benchmarks/step_log_split.py sim21/steps_c.jsonl.gz (launch vs
#     wait by step kind), and the served figures side by side in sim21/bench_{a,c}_*.json.
# If the whole-step tests fail, only the piecewise parts run (C is then skipped).
source benchmarks/device_env.sh
R="$OUT/s30_a"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
logged "$R/tests.log" ${T_TESTS:-120} python3 -m pytest -q -o addopts="" -m cuda tests/kernels/test_cuda_graphs_mixed.py \
  tests/kernels/test_cuda_graphs_piecewise.py tests/kernels/test_cuda_graphs.py tests/engine/test_graph_runner.py
tail -4 "$R/tests.log"
MODES="piecewise,full,full-tiles" RUNS=${RUNS:-a c}
if grep -qE "FAILED tests/kernels/test_cuda_graphs_mixed|FAILED tests/engine/test_graph_runner.py::test_graph_engine_equals_enforce_eager_cuda\[True-full" "$R/tests.log" \
   || ! grep -q "rc=0" "$R/tests.log"; then
  echo "whole-step graphs not validated: piecewise only"; MODES="piecewise" RUNS="a"
fi
logged "$R/probe.log" ${T_PROBE:-150} python3 benchmarks/probe_piecewise.py --modes "$MODES" --iters ${PROBE_ITERS:-15} \
  --json-output "$R/probe.json"
grep -vE "^\s*$" "$R/probe.log" | tail -10 | cut -c1-400
LEFT=$(( ${CALL_S:-575} - SECONDS ))
[ "$LEFT" -lt 150 ] && { echo "no time left for servings ($LEFT s)"; exit 0; }
[ "$LEFT" -lt 300 ] && CONC=${CONC:-1 64}
echo "served runs: $RUNS, $LEFT s left"
timeout $LEFT python3 benchmarks/served_sim_validate.py --device cuda --out "$OUT/sim21" --skip-analysis \
  --runs $RUNS --concurrency ${CONC:-1 16 64 256} --request-rates 8 32 --rate-requests ${RATE_REQ:-120} \
  --c-flags="--cuda-graph-mixed-mode full" 2>&1 | tee "$R/sim21.log" | grep -E "^\[|Error|error" | tail -30
gzip -f "$OUT"/sim21/steps_*.jsonl 2>/dev/null
tar -C "$OUT" -czf "$OUT/sim21.tgz" sim21 && rm -rf "$OUT/sim21"
true
