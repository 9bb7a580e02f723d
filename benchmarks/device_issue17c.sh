#!/usr/bin/env bash
# Device call (issue 17): serve vs LLM.generate with the benchmark client on aiohttp vs httpx (same server), then
# the server with uvicorn's httptools parser (carried wheel in .whl/opt) — uvloop is in the GPU image already.
# Run from the repo root on the GPU machine with the .whl folder carried (device README).
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
python3 -c "import uvloop, aiohttp; print('uvloop', uvloop.__version__, 'aiohttp', aiohttp.__version__)" | tee -a "$OUT/env.txt"
# 1. offline + serve (h11 parser), both clients
timeout ${T_A:-330} python3 benchmarks/serve_vs_offline.py --json-output "$OUT/serve_vs_offline_a.json" \
  --server-log "$OUT/server_a.log" --http-clients aiohttp httpx 2>&1 | tee "$OUT/bench_a.log" | tail -10
# 2. serve with httptools (uvicorn picks it when importable), aiohttp client, with the step log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_h .whl/opt/*.whl || exit 1
PYTHONPATH=$PYTHONPATH:/tmp/site_h timeout ${T_B:-200} python3 benchmarks/serve_vs_offline.py --phases online \
  --json-output "$OUT/serve_vs_offline_b.json" --server-log "$OUT/server_b.log" --http-clients aiohttp \
  --serve-variants "--step-log $OUT/steps_b.jsonl" 2>&1 | tee "$OUT/bench_b.log" | tail -6
gzip -f "$OUT/steps_b.jsonl" 2>/dev/null
true
