#!/usr/bin/env bash
# Device call of session 29 (run tool: timeout_s 600, carry [".whl"]). On an H200: issue 24's V2-Lite bench-moe
# (transformers eager in the same run) first, then issue 21's served pair A/B (step_log_version 3: launch/wait per
# step). On an H100 (issue 24 ran there in run 75): the served A/B plus C (--cuda-graph-piecewise-tokens 0), to test
# the split timeline fit across configurations. Analysis on CPU afterwards:
#   tar -xzf sim21.tgz && PYTHONPATH=src python3 benchmarks/sim_offline_validate.py sim21 --json-output off.json
source benchmarks/device_env.sh
R="$OUT/s29_b"; mkdir -p "$R"
TI="python3 -m torchinferno.cli.main"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
RUNS="a b c"
if grep -q H200 "$R/env.txt"; then
  RUNS="a b"
  logged "$R/bench_v2l.log" ${T_BENCH:-200} $TI bench-moe --sections model --model-shape v2-lite \
    --batches 1 8 64 256 --prefill-tokens 2048 --json-output "$R/bench_v2l.json"
  grep -E "ceilings|model decode|model prefill|transformers|rc=|Error" "$R/bench_v2l.log" | cut -c1-400
fi
LEFT=$(( ${CALL_S:-560} - SECONDS ))
[ "$LEFT" -lt 330 ] && RUNS="a b"  # a short call: a second A/B pair only
[ "$LEFT" -lt 150 ] && { echo "no time left for servings ($LEFT s)"; exit 0; }
echo "served runs: $RUNS, $LEFT s left"
timeout $LEFT python3 benchmarks/served_sim_validate.py --device cuda --out "$OUT/sim21" --skip-analysis \
  --runs $RUNS --concurrency 1 16 64 256 --request-rates 8 32 --rate-requests 120 \
  --c-flags="--cuda-graph-piecewise-tokens 0" 2>&1 | tee "$R/sim21.log" | grep -E "^\[|Error|error" | tail -30
gzip -f "$OUT"/sim21/steps_*.jsonl 2>/dev/null
tar -C "$OUT" -czf "$OUT/sim21.tgz" sim21 && rm -rf "$OUT/sim21"
true
