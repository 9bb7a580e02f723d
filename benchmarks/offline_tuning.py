"""``LLM`` defaults vs tuned engine configs on an offline 1k-in / 1k-out run (issue 17's "defaults that fill the card").

One process builds a random model of ``--model-kind/--model-size`` (default: Llama-3-8B shape, bf16) once, then for
each config (``--configs``: JSON engine kwargs; ``{}`` = defaults) builds an ``LLM`` over it, generates ``--num-prompts``
random-token prompts of ``--input-len`` with ``--output-len`` tokens each (ignore_eos) in ONE ``generate`` call (the
engine batches continuously), and reports output and total tok/s. The table ends with each config's ratio to the best.
Run on the device machine from the repo root:
    PYTHONPATH=src python3 benchmarks/offline_tuning.py --device cuda --json-output $OUT/offline_tuning.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time

DEFAULT_CONFIGS = ['{}', '{"max_num_seqs": 512, "max_num_batched_tokens": 16384}', '{"max_num_seqs": 384}',
                   '{"max_num_batched_tokens": 16384}']


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-kind", default="llama3")
    p.add_argument("--model-size", default="llama3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="engine kwargs as JSON, one run each")
    p.add_argument("--json-output", default=None)
    args = p.parse_args(argv)

    import torch

    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.engine.llm import LLM

    model = build_model(ModelSpec(model_kind=args.model_kind, size=args.model_size, dtype=args.dtype, device=args.device))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 256) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    rows = []
    for text in args.configs:
        kw = json.loads(text)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        llm = LLM(model, tokenizer="byte", **kw)
        t = time.perf_counter()
        res = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t
        out = sum(len(r.token_ids) for r in res)
        st = llm.engine.stats()
        row = {"config": kw, "seconds": dt, "output_tok_s": out / dt, "total_tok_s": (out + args.input_len * len(prompts)) / dt,
               "preemptions": st.num_preemptions, "max_batch_seqs": st.max_batch_seqs, "engine": llm.engine.describe()}
        rows.append(row)
        print(f"{text:60s} {row['output_tok_s']:9.1f} out tok/s {row['total_tok_s']:9.1f} total tok/s  {dt:6.1f} s  "
              f"max batch {row['max_batch_seqs']}  preemptions {row['preemptions']}", flush=True)
        del llm
    best = max(r["output_tok_s"] for r in rows)
    print("\nconfig                                                       out tok/s   of best")
    for r in rows:
        print(f"{json.dumps(r['config']):60s} {r['output_tok_s']:9.1f}   {r['output_tok_s'] / best:5.2f}")
    if args.json_output:
        with open(args.json_output, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
