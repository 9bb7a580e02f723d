#!/usr/bin/env bash
# Device call (session 22's last; run tool: timeout_s 200, carry [".whl"]): the batch-1 step's remaining tiles on
# whichever card comes: the per-token down kernel around the new BLOCK_N 8, the MLA split floor at 16 / 32 rows, the
# dense GEMVs' and the LM head's tiles (probe_ds_prefill.py decode; each beside the bound of the same run).
source benchmarks/device_env.sh
R="$OUT/s22_c"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
timeout ${T_PROBE:-170} python3 benchmarks/probe_ds_prefill.py "$R/probe.json" decode \
  ${PROBE_VARIANTS:-step,step_down_4x2048,step_down_16x2048,step_down_8x1024,step_split32,step_split16,step_proj_8x1024,step_proj_2x2048,step_head_8x1024,step_head_2x2048} \
  > "$R/probe.log" 2>&1
echo "probe rc=$?" >> "$R/probe.log"; grep -E "^decode|rc=|Error" "$R/probe.log" | cut -c1-200
true
