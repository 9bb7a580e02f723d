#!/usr/bin/env bash
# Issue 25 on one H200 (< 4 minutes): cache-aware vs round-robin routing over two 8B-shape replicas (llama3-8b shapes,
# random bf16 weights, one set shared by both replicas' engine cores; each replica its own KV pool) on a
# shared-system-prompt multi-turn chat trace. Stage "bench": bench-router live (steps timed by wall clock; the two
# replicas are stepped in turn on the card, each on its own measured clock: figures as if each had the card to itself;
# eager steps: no CUDA graph capture for each of the five executors built)
# and simulated. Stage "serve": serve --data-parallel-size 2 (two engine-core processes sharing the card, tiny model)
# answers and reports per-replica metrics. Run from the repo root on the GPU machine with the .whl folder carried.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
if [[ ${STAGES:-bench,serve} == *bench* ]]; then
  timeout ${T_BENCH:-200} python3 -m torchinferno.cli.main bench-router --model-size llama3-8b --device cuda \
    --dtype bfloat16 --timer wall --threads 4 --system-prompts 8 --users ${USERS:-24} --turns 3 --system-len 1024 \
    --user-len uniform:32:128 --reply-len uniform:32:96 --rate ${RATE:-12} --think-s 1 --num-blocks ${BLOCKS:-640} \
    --max-num-seqs 64 --max-num-batched-tokens 8192 --enforce-eager --policies ${POLICIES:-round-robin,cache-aware} --sim \
    --json 2> "$OUT/bench_router.log" | tee "$OUT/bench_router.json" | python3 -c "import json,sys; d=json.load(sys.stdin); [print(r['name'], r['metrics'], r['error']) for r in d['results']]; print(d['verdicts'])"; tail -3 "$OUT/bench_router.log"
fi
if [[ ${STAGES:-bench,serve} == *serve* ]]; then
  PORT=18025
  timeout ${T_SERVE:-120} python3 -m torchinferno.cli.main serve --model-kind llama3 --device cuda --dtype bfloat16 \
    --max-model-len 256 --kv-cache-memory 256MiB --data-parallel-size 2 --router-policy cache-aware --port $PORT \
    > "$OUT/serve_dp.log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 1 90); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
  for i in 1 2 3 4; do
    curl -s localhost:$PORT/v1/completions -H 'content-type: application/json' \
      -d "{\"prompt\": \"shared system prompt for every user, request $i\", \"max_tokens\": 16, \"temperature\": 0}" \
      | tee -a "$OUT/serve_dp_answers.jsonl"; echo >> "$OUT/serve_dp_answers.jsonl"
  done
  curl -s localhost:$PORT/metrics | grep -E "^torchinferno_(replica|router)_" | tee "$OUT/serve_dp_metrics.txt"
  kill -TERM $SERVE_PID; wait $SERVE_PID; echo "serve exit $?" | tee -a "$OUT/serve_dp.log"
fi
true
