"""Prefill/decode disaggregation with tensor parallelism per role on CUDA (issue 20, Deliver item 2): the
``tests/disagg/test_disagg_tp.py`` check on GPUs. A ``DisaggLLM`` with ``--tensor-parallel-size N`` per role
(``--prefill-devices`` / ``--decode-devices``: comma lists of N GPUs; disjoint lists -> one NCCL pair per TP rank and
an NCCL fan-out among the decode ranks; the same lists -> cuda-ipc pairs) against a colocated engine on one GPU
(same seed, tiny fp32): tokens (greedy, seeded, prefix hits) must be equal and the bytes moved must equal the live
tokens' KV bytes exactly. One JSON line per family to ``--json-output``; exit 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time


def check(kind: str, prefill: str, decode: str, tp: int) -> dict:
    import torch

    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.disagg.client import DisaggConfig, DisaggLLM
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.llm_engine import LLMEngine
    from torchinferno.testing import wide_byte_tokenizer

    cfg = EngineConfig(block_size=16, kv_cache_memory="256MiB", max_model_len=256, max_num_seqs=16)
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, 250, (40,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 250, (int(k),), generator=g).tolist()
               for k in torch.randint(1, 60, (8,), generator=g)]
    params = [SamplingParams(max_tokens=12, ignore_eos=True, **({"temperature": 0.0} if i % 2 == 0 else
                                                               {"temperature": 0.8, "top_p": 0.9, "seed": i}))
              for i in range(len(prompts))]
    one = prefill.split(",")[0]
    model = build_model(ModelSpec(model_kind=kind, dtype="float32", device=one))
    bpt = model.family.kv_spec(model.config).bytes_per_token(torch.float32)
    colo = LLMEngine(model, config=dataclasses.replace(cfg))
    for i, p in enumerate(prompts):
        colo.add_request(f"r{i}", p, params[i])
    ref = colo.run_to_completion()
    want = [ref[f"r{i}"].token_ids for i in range(len(prompts))]
    del colo, model
    torch.cuda.empty_cache()

    t0 = time.perf_counter()
    spec = ModelSpec(model_kind=kind, dtype="float32", device=one)
    record = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name  # noqa: SIM115 - a path only
    llm = DisaggLLM(spec, dataclasses.replace(cfg, tensor_parallel_size=tp), wide_byte_tokenizer(512),
                    DisaggConfig(prefill_device=prefill, decode_device=decode, timeout_s=120, record_path=record))
    started = time.perf_counter() - t0

    async def gen(rid, p, sp):
        toks = []
        async for o in llm.generate(rid, p, sp):
            toks = o.token_ids
        return toks

    async def main():
        first = await gen("warm", prompts[0], params[0])
        rest = await asyncio.gather(*[gen(f"r{i}", p, params[i]) for i, p in enumerate(prompts)])
        return first, rest

    try:
        first, got = asyncio.run(main())
        totals, describe, topo = llm.totals, llm.describe(), llm.topology()
    finally:
        llm.shutdown()
    with open(record) as f:
        groups = [json.loads(line)["kv_transfer"] for line in f]
    live_tokens = sum(r["tokens_group"] for r in groups)
    exact = totals.nbytes == live_tokens * bpt and all(r["bytes_group"] == r["tokens_group"] * bpt for r in groups)
    return {"kind": kind, "tp": tp, "prefill": prefill, "decode": decode, "backend": llm.backend,
            "tokens_equal": first == want[0] and got == want, "mismatches": sum(a != b for a, b in zip(got, want)),
            "transfers": totals.count, "failed": totals.failed, "bytes": totals.nbytes, "bytes_per_token": bpt,
            "bytes_exact": exact, "live_tokens": live_tokens,
            "start_s": round(started, 1), "describe": describe, "topology": topo}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill-devices", default="cuda:0,cuda:1")
    ap.add_argument("--decode-devices", default="cuda:2,cuda:3")
    ap.add_argument("--kinds", nargs="+", default=["llama3", "deepseek-v3.2"])
    ap.add_argument("--tp", type=int, default=None, help="ranks per role (default: the prefill list's length)")
    ap.add_argument("--json-output", default=None)
    a = ap.parse_args()
    tp = a.tp or len(a.prefill_devices.split(","))
    ok = True
    for kind in a.kinds:
        try:
            rec = check(kind, a.prefill_devices, a.decode_devices, tp)
        except Exception as e:  # noqa: BLE001 - reported, next family
            rec = {"kind": kind, "tp": tp, "error": f"{type(e).__name__}: {e}"}
        good = rec.get("tokens_equal") and rec.get("failed") == 0 and rec.get("bytes_exact")
        ok &= bool(good)
        print(f"{'OK ' if good else 'BAD'} {kind} tp={tp} {a.prefill_devices} -> {a.decode_devices}: "
              + json.dumps({k: v for k, v in rec.items() if k not in ("describe", "topology")}), flush=True)
        if a.json_output:
            with open(a.json_output, "a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
