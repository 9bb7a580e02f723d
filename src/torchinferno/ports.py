"""A free TCP port on the loopback interface (servers started by tests and benchmarks, torch.distributed rendezvous).

The port is free when returned; another process can still take it before the caller binds it. Callers that start a
rendezvous start once more on fresh ports when that happened (:func:`once_more_if_port_taken`):
``parallel.spawn.run_ranks``, ``engine.multiproc_executor.MultiprocExecutor``, ``disagg.launch.start_role_cores``
(the KV stores bind at role startup).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TypeVar

__all__ = ["address_in_use", "free_port", "once_more_if_port_taken"]

T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def address_in_use(err: BaseException) -> bool:
    """Whether ``err`` (a rank's startup failure, as text) is a port taken before it was bound."""
    return "address already in use" in str(err).lower()


def once_more_if_port_taken(start: Callable[[], T], retry: bool = True) -> T:
    """``start()``, and when it fails because a port it picked was taken meanwhile (:func:`address_in_use`), once
    more (``start`` picks fresh ports each call and leaves nothing running when it raises). ``retry=False``: a
    port the user chose, not retried."""
    try:
        return start()
    except BaseException as e:
        if not retry or not address_in_use(e):
            raise
    return start()
