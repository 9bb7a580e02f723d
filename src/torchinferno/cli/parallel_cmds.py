"""``plan-parallel``: a model's tensor-parallel plan per rank, on ``meta`` (no weights, no world).

``torchinferno plan-parallel --size llama3-70b --tp 8`` prints rank 0's bytes of weights and KV cache, the
collectives of one decode step and the bytes they move (``parallel.fake.plan_parallel``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from torchinferno.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan-parallel", help="per-rank memory and collectives of a tensor-parallel plan (meta, no weights)")
    p.add_argument("--size", required=True, help="a family size name, e.g. llama3-70b, llama3-8b, small")
    p.add_argument("--family", "--model-kind", dest="family", default=None,
                   help="the family (default: the one that has --size)")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16", help="weights dtype (default bfloat16)")
    p.add_argument("--batch", type=int, default=1, help="decode batch for the bytes per step (default 1)")
    p.add_argument("--context", type=int, default=8192, help="tokens of KV cache to size (default 8192)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan_parallel)


def family_of_size(size: str, family: str | None) -> str:
    from torchinferno.models.registry import family_names, get_family

    if family is not None:
        get_family(family).size(size)  # one-line error for a size the family lacks
        return get_family(family).name
    having = [n for n in family_names() if size in get_family(n).sizes]
    if not having:
        valid = sorted({s for n in family_names() for s in get_family(n).sizes})
        raise ConfigError(f"unknown size '{size}' (valid: {', '.join(valid)})")
    if len(having) > 1:
        raise ConfigError(f"size '{size}' exists in several families ({', '.join(having)}); pass --family")
    return having[0]


def cmd_plan_parallel(a: argparse.Namespace) -> int:
    from torchinferno.checkpoint.auto import resolve_dtype
    from torchinferno.parallel.config import ParallelConfig
    from torchinferno.parallel.fake import plan_parallel

    ParallelConfig(tp_size=a.tp)  # one-line refusal of a size < 1
    if a.batch < 1 or a.context < 1:
        raise ConfigError("--batch and --context must be >= 1")
    family = family_of_size(a.size, a.family)
    from torchinferno.models.registry import get_family

    fam = get_family(family)
    if a.tp > 1:
        from torchinferno.parallel.checks import check_split

        check_split(fam, fam.size(a.size), a.tp)
    plan = plan_parallel(family, a.size, a.tp, resolve_dtype(a.dtype), a.batch)
    if a.json:
        d = {k: v for k, v in asdict(plan).items() if k != "kv_spec"}
        print(json.dumps({**d, "context": a.context, "kv_bytes_context": plan.kv_bytes(a.context)}))
    else:
        print("\n".join(plan.lines(a.context)))
    return 0
