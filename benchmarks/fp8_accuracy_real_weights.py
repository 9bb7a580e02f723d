"""Accuracy of the FP8 weight formats on real weights (issue 24 deliverable 3): the default model's checkpoint
(SmolLM2-135M-Instruct, a Llama) in bf16 vs ``--quantization fp8-block`` (DeepSeek-V3's 128x128 block scales,
W8A8 with per-token 128-wide activation groups) and vs ``--quantization fp8`` (per-channel), through
``bench.quant_accuracy.compare``: greedy-token agreement over its held-out prompts and perplexity over its text.

The GPU probe (benchmarks/probe_fp8_block.py accuracy) runs the V2-Lite-like shape with random weights, whose
near-flat logits make argmax agreement meaningless; this is the same recipe on a trained model. Runs on CPU
(the torch reference of both formats) or CUDA (their Triton kernels):

    PYTHONPATH=src python3 benchmarks/fp8_accuracy_real_weights.py [--device cpu] [--json-output F]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def main() -> None:
    from torchinferno.bench.quant_accuracy import compare, format_accuracy
    from torchinferno.engine.assembly import ModelSpec, build_model, tokenizer_spec
    from torchinferno.text.tokenizer import load_tokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="cpu")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--json-output", default=None)
    a = p.parse_args()
    ref = build_model(ModelSpec(model=a.model, dtype="bfloat16", device=a.device, prepack=False))
    tok = load_tokenizer(tokenizer_spec(ModelSpec(model=a.model), None, ref.checkpoint_dir))
    out = {"model": a.model, "device": a.device}
    for q in ("fp8-block", "fp8"):
        model = build_model(ModelSpec(model=a.model, dtype="bfloat16", device=a.device, quantization=q, prepack=False))
        rep = compare(ref, model, tok, a.new_tokens)
        print(format_accuracy(rep, "bf16", q), flush=True)
        out[q] = asdict(rep)
        del model
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
