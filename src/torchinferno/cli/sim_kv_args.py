"""The simulated model's KV layout for ``sim-smoke`` / ``traffic-smoke`` / ``sim-plan`` (``sim.kv_source``):
``--model-kind FAMILY --size NAME`` or ``--kv-spec-from CONFIG``; without either, replicas keep one whole-context
pool of ``--num-blocks`` (or ``--kv-cache-memory`` / ``--kv-bytes-per-token``) blocks, as before."""

from __future__ import annotations

import argparse

from torchinferno.errors import ConfigError


def add_kv_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-kind", default=None,
                   help="size each replica's KV pools for this family's KV layout (llama3, deepseek-v4, ...; hybrid "
                        "deepseek-v4 gets its sliding-window pool) with the engine's planner; default: one "
                        "whole-context pool")
    p.add_argument("--size", default="debug", help="named size of --model-kind (e.g. llama3-8b, deepseek-v4-flash; "
                                                   "default: debug)")
    p.add_argument("--kv-spec-from", default=None, metavar="CONFIG",
                   help="instead of --model-kind: a checkpoint's config.json (or its directory)")


def kv_from_args(a):
    """``sim.kv_source.ModelKV`` of the flags, or None; refuses a KV spec with ``--kv-bytes-per-token`` (the spec's
    own bytes price the P/D transfer)."""
    from torchinferno.sim.kv_source import model_kv

    kv = model_kv(a.model_kind, a.size, a.kv_spec_from)
    if kv is not None and a.kv_bytes_per_token is not None:
        raise ConfigError("--kv-bytes-per-token and a KV spec (--model-kind / --kv-spec-from) both set the KV bytes: "
                          "give one")
    return kv
