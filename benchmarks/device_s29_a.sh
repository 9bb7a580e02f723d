#!/usr/bin/env bash
# Device call of session 29 (run tool: kind nvidia-h200, timeout_s 600, carry [".whl"]): issue 24's targets are set on
# the H200 and no H200 has run the DeepSeek path since session 22. Most important first (a cut call still returns $OUT):
# (1) tune-moe for the V2-Lite experts at the 2048-token prefill (12,288 pairs) on this device: the stored tiles were
#     tuned on an H100 (run 64); the tiles are data, so a better H200 tile is committed from tune_v2l's json;
# (2) bench-moe --model-shape v2-lite, batches 1 8 64 256 and prefill 2048, transformers eager in the same run;
# (3) probe_prefill_moe.py moe: one MoE layer at 2048 tokens, Triton grouped GEMMs against torch._grouped_mm and a
#     dense cuBLAS GEMM of the same FLOPs (is the prefill MoE bandwidth- or tile-bound on this device?);
# (4) bench-moe --model-shape v3-scaled --layers 8 --quantization fp8-block (4 layers on an 80 GB card).
source benchmarks/device_env.sh
R="$OUT/s29_a"; mkdir -p "$R"
TI="python3 -m torchinferno.cli.main"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
V3_LAYERS=8; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] && V3_LAYERS=4
[ "${T_TUNE:-75}" -gt 1 ] && logged "$R/tune_v2l.log" ${T_TUNE:-75} $TI tune-moe --shape 64,6,2048,1408 --tokens 2048 \
  --budget-s $(( ${T_TUNE:-75} - 15 ))
grep -E "best|budget|rc=|Error" "$R/tune_v2l.log" | cut -c1-220; cp src/torchinferno/kernels/triton/fused_moe_configs.json "$R/"
logged "$R/bench_v2l.log" ${T_BENCH:-200} $TI bench-moe --sections model --model-shape v2-lite \
  --batches 1 8 64 256 --prefill-tokens 2048 --json-output "$R/bench_v2l.json"
grep -E "ceilings|model decode|model prefill|transformers|rc=|Error" "$R/bench_v2l.log" | cut -c1-400
[ "${T_PARTS:-70}" -gt 1 ] && logged "$R/parts.log" ${T_PARTS:-70} python3 benchmarks/probe_prefill_moe.py "$R/parts.json" moe
grep -vE "^\s*$" "$R/parts.log" | tail -12 | cut -c1-300
[ "${T_V3:-150}" -gt 1 ] && logged "$R/bench_v3.log" ${T_V3:-150} $TI bench-moe --sections model --model-shape v3-scaled \
  --layers $V3_LAYERS --quantization fp8-block --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v3.json"
grep -E "ceilings|model decode|model prefill|rc=|Error" "$R/bench_v3.log" | cut -c1-400
true
