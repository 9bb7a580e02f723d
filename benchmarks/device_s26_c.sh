#!/usr/bin/env bash
# Device call (session 26; run tool: timeout_s 600, carry [".whl"]; an H200: issue 24's targets are set there):
# (1) bench-moe on the V2-Lite-like model, transformers eager in the same run, batches 1 8 64 256 and prefill 2048;
# (2) bench-moe --model-shape v3-scaled, 8 layers in fp8-block (4 fit an H100, run 71);
# (3) the in-process 128-token prefill of the 8B shape, eager against the prefill graphs.
source benchmarks/device_env.sh
R="$OUT/s26_c"; mkdir -p "$R"
TI="python3 -m torchinferno.cli.main"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
logged "$R/bench_v2l.log" ${T_BENCH:-200} $TI bench-moe --sections model --model-shape v2-lite \
  --batches 1 8 64 256 --prefill-tokens 2048 --json-output "$R/bench_v2l.json"
grep -E "ceilings|model decode|model prefill|transformers|rc=|Error" "$R/bench_v2l.log" | cut -c1-400
logged "$R/bench_v3.log" ${T_V3:-200} $TI bench-moe --sections model --model-shape v3-scaled --layers ${V3_LAYERS:-8} \
  --quantization fp8-block --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v3.json"
grep -E "ceilings|model decode|model prefill|rc=|Error" "$R/bench_v3.log" | cut -c1-400
logged "$R/prefill_host.log" ${T_HOST:-100} python3 benchmarks/probe_prefill_host.py --size llama3-8b --requests 30 \
  --prefill-graph-tokens 0 512
grep -E "per request|profiled|rc=|Error" "$R/prefill_host.log" | cut -c1-300
true
