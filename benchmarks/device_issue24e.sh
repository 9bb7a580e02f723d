#!/usr/bin/env bash
# Device call (issue 24, session 12): the batch-1 MoE launches and the path thresholds. Runs the CUDA tests of what
# changed (per-token MoE kernels, router GEMV, moe_sum, shared-experts threshold, MLA prefill over a cached context
# through flash, engine graphs == eager), then bench-moe on the V2-Lite-like shape: the MoE layer at 1/2/4/8/64/256
# tokens + 2048 with the policy A/Bs (shared experts in / apart; per-token vs grouped up to 8 tokens), the model at
# batch 1/8/64/256 decode from CUDA graphs + prefill 2048, the same-run bound (copy bandwidth) and matmul rate,
# launches per layer (torch.profiler) and device time per kernel of the batch-1 step and of the prefill; and
# benchmarks/probe_moe_small.py (per-token MoE tile sweep vs the grouped GEMMs at 1/2/4 tokens).
# About 4-5 minutes; carries nothing but the repo (wheels in .whl/ are installed when present, for the engine test).
# Everything lands in $OUT/issue24e.tar.gz; a compact summary is printed at the end.
#   bash benchmarks/device_issue24e.sh          (run tool: timeout_s 330)
source benchmarks/device_env.sh
R="$OUT/issue24e"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv > "$R/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/env.txt"
git log --oneline -1 > "$R/commit.txt" 2>/dev/null || true
if [[ ${STAGES:-tests,bench,probe} == *tests* ]]; then
  timeout ${T_TESTS:-100} python3 -m pytest tests/kernels/test_fused_moe.py tests/kernels/test_mla_prefill.py \
    tests/engine/test_graph_runner.py -k "cuda or graph" -p no:cacheprovider -rA -q > "$R/tests.log" 2>&1
  echo "tests rc=$?" >> "$R/tests.log"
fi
if [[ ${STAGES:-tests,bench,probe} == *probe* ]]; then  # per-token MoE tiles vs the grouped GEMMs at 1/2/4 tokens
  timeout ${T_PROBE:-60} python3 benchmarks/probe_moe_small.py "$R/probe_moe_small.json" > "$R/probe.log" 2>&1
  echo "probe rc=$?" >> "$R/probe.log"
fi
if [[ ${STAGES:-tests,bench,probe} == *bench* ]]; then
  timeout ${T_BENCH:-150} python3 - "$R/bench_moe.json" > "$R/bench.log" 2>&1 <<'EOF'
import json, sys
from torchinferno.bench.moe_bench import run_bench_moe
rep = run_bench_moe(("layer", "model"), (1, 8, 64, 256), 2048, True, None, ("v2-lite",),
                    layer_batches=(1, 2, 4, 8, 64, 256))
json.dump(rep, open(sys.argv[1], "w"), indent=1, default=str)
EOF
  echo "bench rc=$?" >> "$R/bench.log"
fi
echo "== issue24e summary ($(cat "$R/commit.txt" 2>/dev/null))"
grep -E "^torch" "$R/env.txt"
[[ -f "$R/tests.log" ]] && { grep -E "^(FAILED|ERROR)" "$R/tests.log" | head -12; grep -E "passed|failed|rc=" "$R/tests.log" | tail -2; }
[[ -f "$R/probe.log" ]] && grep -E "copy bandwidth|^T=|Error|rc=" "$R/probe.log" | cut -c1-300
[[ -f "$R/bench.log" ]] && grep -E "ceilings|layer M=|launches per layer|model decode|model prefill|kernels [0-9.]+ ms|top:|skipped|transformers eager|Error|rc=" \
  "$R/bench.log" | cut -c1-400
tar -czf "$OUT/issue24e.tar.gz" -C "$OUT" issue24e && rm -rf "$R"
true
