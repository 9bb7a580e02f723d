#!/usr/bin/env bash
# Device call (issue 20): prefill/decode disaggregation on CUDA, both roles sharing one GPU (gloo transport staged
# through the host; two GPUs: DECODE_DEVICE=cuda:1 picks NCCL): token equality (tiny fp32 asserted; 8B shape bf16
# reported), KV transfer bandwidth next to the same-run device copy bandwidth, a small serve run. < 4 minutes.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
timeout ${T_DISAGG:-220} python3 benchmarks/disagg_device.py --device cuda:0 --decode-device ${DECODE_DEVICE:-cuda:0} \
  --stages ${STAGES:-equality,bandwidth,serve} --size ${SIZE:-llama3-8b} --tokens ${TOKENS:-4096} \
  --json-output "$OUT/disagg_device.jsonl" 2>&1 | grep -v DEBUG | tee "$OUT/disagg.log" | tail -20
