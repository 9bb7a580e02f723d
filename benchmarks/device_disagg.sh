#!/usr/bin/env bash
# Device call (issue 20): prefill/decode disaggregation on CUDA, both roles sharing one GPU (gloo transport staged
# through the host; two GPUs: DECODE_DEVICE=cuda:1 picks NCCL): token equality (tiny fp32 asserted; 8B shape bf16
# reported), KV transfer bandwidth next to the same-run device copy bandwidth, a small serve run. < 4 minutes.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/env.txt"
timeout ${T_DISAGG:-220} python3 benchmarks/disagg_device.py --device cuda:0 --decode-device ${DECODE_DEVICE:-cuda:0} \
  --stages ${STAGES:-equality,bandwidth,serve} --size ${SIZE:-llama3-8b} --tokens ${TOKENS:-4096} \
  --json-output "$OUT/disagg_device.jsonl" 2>&1 | grep -v DEBUG | tee "$OUT/disagg.log" | tail -20
# The rank files on CUDA (issue 20 item 3): the README's disagg-init / disagg-smoke lines, one prefill + one decode rank.
if [[ ${RANKS:-1} == 1 ]]; then
  D=/tmp/disagg_ranks; rm -rf $D
  python3 -m torchinferno.cli.main disagg-init $D --prefill-ranks 1 --decode-ranks 1 --base-port 8800 --device cuda \
    --family llama3 2>&1 | tail -2
  python3 $D/rank_0_prefill.py > "$OUT/rank0.log" 2>&1 & P0=$!
  python3 $D/rank_1_decode.py > "$OUT/rank1.log" 2>&1 & P1=$!
  for i in $(seq 120); do curl -sf localhost:8800/health >/dev/null && curl -sf localhost:8801/health >/dev/null && break; sleep 1; done
  timeout 120 python3 -m torchinferno.cli.main disagg-smoke --prefill-url http://127.0.0.1:8800 \
    --decode-url http://127.0.0.1:8801 --prompt 1 2 3 --new-tokens 8 --check 2>&1 | tee "$OUT/ranks_smoke.log" | tail -8
  kill $P0 $P1 2>/dev/null; wait 2>/dev/null
fi
true
