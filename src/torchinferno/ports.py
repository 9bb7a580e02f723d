"""A free TCP port on the loopback interface (servers started by tests and benchmarks, torch.distributed rendezvous).

The port is free when returned; another process can still take it before the caller binds it (callers that start a
rendezvous retry once when :func:`address_in_use` says their error was that: ``parallel.spawn.run_ranks``,
``engine.multiproc_executor.MultiprocExecutor``, ``disagg.launch.start_role_cores``: the KV stores bind at role startup).
"""

from __future__ import annotations

import socket

__all__ = ["address_in_use", "free_port"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def address_in_use(err: BaseException) -> bool:
    """Whether ``err`` (a rank's startup failure, as text) is a port taken before it was bound."""
    return "address already in use" in str(err).lower()
