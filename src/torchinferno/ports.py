"""A free TCP port on the loopback interface (servers started by tests and benchmarks, torch.distributed rendezvous).

The port is free when returned; another process can still take it before the caller binds it (callers that start a
rendezvous retry once on "address already in use": ``parallel.spawn.run_ranks``).
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
