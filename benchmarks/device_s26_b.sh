#!/usr/bin/env bash
# Device call (session 26; run tool: timeout_s 600, carry [".whl"]): CUDA-graph prefill of one fresh prompt
# (kernels/cuda_graphs_prefill.py, EngineConfig.cuda_graph_prefill_tokens). Most important first:
# (1) the CUDA tests of the prefill and decode graphs and the engine's graph runner;
# (2) the in-process 128-token prefill of the 8B shape, eager (0) against graphs (512), after idle gaps too;
# (3) served C 1 (32 requests, 128 in / 128 out), --cuda-graph-prefill-tokens 0 against the default, one server each;
# (4) bench-moe --model-shape v3-scaled with 4 layers in fp8-block (what fits an H100; 8 on an H200).
source benchmarks/device_env.sh
R="$OUT/s26_b"; mkdir -p "$R"
TI="python3 -m torchinferno.cli.main"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/env.txt"
logged "$R/tests.log" ${T_TESTS:-150} python3 -m pytest -p no:cacheprovider -o addopts="" --tb=short -q -m cuda \
  tests/kernels/test_cuda_graphs_prefill.py tests/kernels/test_cuda_graphs.py tests/engine/test_graph_runner.py \
  tests/engine/test_async_scheduling.py
tail -5 "$R/tests.log" | cut -c1-300
logged "$R/prefill_host.log" ${T_HOST:-120} python3 benchmarks/probe_prefill_host.py --size llama3-8b --requests 30 \
  --prefill-graph-tokens 0 512 --idle-ms 3 20
grep -E "per request|after|profiled|rc=|Error" "$R/prefill_host.log" | cut -c1-300
for pg in 0 512; do
  logged "$R/serve_c1_pg$pg.log" ${T_SERVE:-110} python3 benchmarks/served_sim_validate.py --device cuda --runs a \
    --concurrency 1 --out "$R/c1_pg$pg" --serve-flags "--cuda-graph-prefill-tokens $pg"
  grep -E "^\[|rc=|Error" "$R/serve_c1_pg$pg.log" | tail -4 | cut -c1-300
  gzip -f "$R"/c1_pg$pg/steps_*.jsonl 2>/dev/null
done
logged "$R/bench_v3.log" ${T_V3:-150} $TI bench-moe --sections model --model-shape v3-scaled --layers ${V3_LAYERS:-4} \
  --quantization fp8-block --batches 1 64 --prefill-tokens 2048 --json-output "$R/bench_v3.json"
grep -E "ceilings|model decode|model prefill|rc=|Error" "$R/bench_v3.log" | cut -c1-400
tar -C "$R" -czf "$R/c1.tgz" c1_pg0 c1_pg512 && rm -rf "$R"/c1_pg0 "$R"/c1_pg512
true
