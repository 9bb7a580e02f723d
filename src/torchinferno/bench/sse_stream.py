"""The benchmark client's streaming transport: one pooled HTTP client that POSTs a JSON body and yields the
response's lines (SSE), on aiohttp or httpx.

Why two: the client must never be what a serving benchmark measures. At a few thousand SSE chunks per second
(an 8B model at concurrency 64 on an H200) an httpx client saturates its own core, so the benchmark would
report the client's ceiling, not the server's; aiohttp (what ``vllm bench serve`` uses) spends a fraction of
that per chunk. ``auto`` picks aiohttp when it is installed, else httpx; the result JSON records which.

Invariant: ``lines()`` never yields for a non-200 answer; it raises ``BadStatus`` with the body's text.
Lines are yielded without their line terminators, blank lines included.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import AsyncIterator

from torchinferno.errors import ConfigError

__all__ = ["HTTP_CLIENTS", "BadStatus", "SSEStreamer", "as_streamer", "open_streamer", "resolve_http_client"]

HTTP_CLIENTS = ("auto", "aiohttp", "httpx")


class BadStatus(Exception):
    """The server answered with a non-200 status; ``body`` is its text (error JSON, usually)."""

    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


def resolve_http_client(name: str) -> str:
    """``auto`` -> aiohttp when importable, else httpx; an explicit choice must be installed."""
    if name not in HTTP_CLIENTS:
        raise ConfigError(f"unknown --http-client {name!r} (valid: {', '.join(HTTP_CLIENTS)})")
    have_aiohttp = importlib.util.find_spec("aiohttp") is not None
    if name == "auto":
        return "aiohttp" if have_aiohttp else "httpx"
    if name == "aiohttp" and not have_aiohttp:
        raise ConfigError("--http-client aiohttp: aiohttp is not installed (pip install aiohttp), or pass --http-client httpx")
    return name


class SSEStreamer:
    """A pooled client with one method, ``lines(url, body, headers)``; ``kind`` names the library."""

    def __init__(self, kind: str, client, owned: bool):
        self.kind = kind
        self._client = client
        self._owned = owned

    @contextlib.asynccontextmanager
    async def lines(self, url: str, body: dict, headers: dict, timeout_s: float) -> AsyncIterator[AsyncIterator[str]]:
        """``async with s.lines(...) as it: async for line in it`` — the connection goes back to the pool on exit."""
        if self.kind == "aiohttp":
            import aiohttp

            async with self._client.post(url, data=json.dumps(body), headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    raise BadStatus(resp.status, await resp.text(errors="replace"))
                yield _aiohttp_lines(resp.content)
        else:
            async with self._client.stream("POST", url, json=body, headers=headers, timeout=timeout_s) as resp:
                if resp.status_code != 200:
                    raise BadStatus(resp.status_code, (await resp.aread()).decode("utf-8", "replace"))
                yield resp.aiter_lines()

    async def aclose(self) -> None:
        if self._owned:
            await (self._client.close() if self.kind == "aiohttp" else self._client.aclose())


async def _aiohttp_lines(content) -> AsyncIterator[str]:
    # StreamReader iterates line by line (each ends in b"\n" but possibly the last)
    async for raw in content:
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


def as_streamer(client) -> SSEStreamer:
    """Wrap an existing httpx.AsyncClient (callers that already hold one); a streamer passes through."""
    if isinstance(client, SSEStreamer):
        return client
    return SSEStreamer("httpx", client, owned=False)


@contextlib.asynccontextmanager
async def open_streamer(name: str, timeout_s: float) -> AsyncIterator[SSEStreamer]:
    """A new pooled client of ``resolve_http_client(name)`` with no cap on connections (the benchmark's
    semaphore caps concurrency), closed on exit."""
    kind = resolve_http_client(name)
    if kind == "aiohttp":
        import aiohttp

        client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                       timeout=aiohttp.ClientTimeout(total=timeout_s), trust_env=False)
    else:
        import httpx

        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                                   timeout=timeout_s, trust_env=False)
    s = SSEStreamer(kind, client, owned=True)
    try:
        yield s
    finally:
        await s.aclose()
