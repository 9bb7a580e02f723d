#!/usr/bin/env bash
# Device call (next session; run tool: timeout_s 600, carry [".whl"]; ask for an H200: the issue-24 targets are set
# there, and session 25's figures are H100 only). Most important first (a cut call still returns what $OUT holds):
# (1) bench-moe on the V2-Lite-like model with session 25's defaults (pdl_chain, the in-place MLA prefill, tuned
#     prefill tiles, the four-launch sort past 512 pairs), transformers eager in the same run, batches 1 8 64 256;
# (2) issue 21: the in-process 128-token prefill of the 8B shape after idle gaps (sleeping vs spinning), beside the
#     served step logs' 15-35 ms (run 65);
# (3) tune-moe for the V3 experts at prefill sizes (the table stops at 4,096 pairs there), then bench-moe
#     --model-shape v3-scaled --layers 8 (4 on an H100) --quantization fp8-block (no transformers peer in fp8-block).
source benchmarks/device_env.sh
R="$OUT/s26_a"; mkdir -p "$R"
TI="python3 -m torchinferno.cli.main"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
# 8 V3-shape FP8 layers need ~95 GB: an H100 (80 GB) takes 4
V3_LAYERS=8; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] && V3_LAYERS=4
logged "$R/bench_v2l.log" ${T_BENCH:-200} $TI bench-moe --sections model --model-shape v2-lite \
  --batches 1 8 64 256 --prefill-tokens 2048 --json-output "$R/bench_v2l.json"
grep -E "ceilings|model decode|model prefill|transformers|rc=|Error" "$R/bench_v2l.log" | cut -c1-400
[ "${T_HOST:-90}" -gt 1 ] && logged "$R/prefill_host.log" ${T_HOST:-90} python3 benchmarks/probe_prefill_host.py --size llama3-8b --requests 30 \
  --idle-ms 3 20
grep -E "per request|after|profiled|rc=|Error" "$R/prefill_host.log" | cut -c1-300
[ "${T_TUNE:-120}" -gt 1 ] && logged "$R/tune_v3.log" ${T_TUNE:-120} $TI tune-moe --shape 256,8,7168,2048 --tokens 2048 512 1024 --budget-s 100
grep -E "best|budget|rc=|Error" "$R/tune_v3.log" | cut -c1-200; cp src/torchinferno/kernels/triton/fused_moe_configs.json "$R/"
logged "$R/bench_v3.log" ${T_V3:-160} $TI bench-moe --sections model --model-shape v3-scaled --layers $V3_LAYERS \
  --quantization fp8-block --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v3.json"
grep -E "ceilings|model decode|model prefill|rc=|Error" "$R/bench_v3.log" | cut -c1-400
true
