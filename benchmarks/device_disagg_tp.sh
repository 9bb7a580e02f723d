#!/usr/bin/env bash
# Device call (issue 20, session 13): --tensor-parallel-size per role in prefill/decode disaggregation on CUDA.
# benchmarks/disagg_tp_device.py on tiny fp32 llama3 (GQA shards per pair), deepseek-v3.2 and deepseek-v4
# (replicated MLA / V4 rows: each tensor crosses on its owner's pair, then an NCCL broadcast among the decode
# ranks), TP=2 per role, against one-GPU colocated serving: tokens equal,
# bytes moved == live tokens' KV bytes. Case "nccl": prefill cuda:0,cuda:1 -> decode cuda:2,cuda:3 (4 GPUs: NCCL
# pairs + NCCL fan-out); case "ipc": both roles on cuda:0,cuda:1 (cuda-ipc pairs; 2 GPUs suffice). < 5 minutes.
# Run from the repo root on a 4-GPU machine (nvidia-h100-x4) with the .whl folder carried (device README):
#   bash benchmarks/device_disagg_tp.sh            (CASES=ipc on 2 GPUs)
source benchmarks/device_env.sh
R="$OUT/disagg_tp"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
if [[ ${CASES:-nccl,ipc} == *nccl* ]]; then
  timeout ${T_NCCL:-200} python3 benchmarks/disagg_tp_device.py --prefill-devices cuda:0,cuda:1 \
    --decode-devices cuda:2,cuda:3 --kinds ${NCCL_KINDS:-llama3 deepseek-v3.2 deepseek-v4} --json-output "$R/disagg_tp.jsonl" 2>&1 | grep -v DEBUG > "$R/nccl.log"
  echo "nccl rc=$?"; grep -E "^(OK|BAD)|Error|error" "$R/nccl.log" | cut -c1-400 | tail -8
fi
if [[ ${CASES:-nccl,ipc} == *ipc* ]]; then
  timeout ${T_IPC:-90} python3 benchmarks/disagg_tp_device.py --prefill-devices cuda:0,cuda:1 \
    --decode-devices cuda:0,cuda:1 --kinds ${IPC_KINDS:-llama3} --json-output "$R/disagg_tp.jsonl" 2>&1 \
    | grep -v DEBUG > "$R/ipc.log"
  echo "ipc rc=$?"; grep -E "^(OK|BAD)|Error|error" "$R/ipc.log" | cut -c1-400 | tail -8
fi
tar -czf "$OUT/disagg_tp.tar.gz" -C "$OUT" disagg_tp && rm -rf "$R"
true
