"""Serving commands: ``serve`` / ``openai-server``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from torchinferno.server.launch import add_server_args

    for name in ("serve", "openai-server"):
        p = sub.add_parser(name, help="OpenAI-compatible HTTP server (FastAPI + uvicorn)")
        add_server_args(p)
        p.set_defaults(func=cmd_serve)


def cmd_serve(a) -> int:
    from torchinferno.server.launch import serve

    return serve(a)
