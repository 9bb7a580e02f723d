"""The rank files' local RPC over HTTP (``runtime.disagg``): a stdlib server around a ``DisaggRank``, a client, and
the driver that hands one request from a prefill rank to a decode rank.

Why stdlib ``http.server`` (``ThreadingHTTPServer``) and ``http.client``: a rank file must run as
``python3 rank_0_prefill.py`` with nothing but the package importable; the RPC is a handful of blocking calls
on one model (serialized by the rank's lock anyway), so an event loop, FastAPI or gRPC add dependencies and
indirection without buying concurrency; and binary bodies are just ``Content-Length`` bytes.

Routes: ``GET /health``; ``POST /prefill`` (JSON -> framed), ``POST /kv`` (JSON -> framed), ``POST /decode``
(framed -> JSON), ``POST /release`` (JSON -> JSON); /prefill and /kv on prefill ranks, /decode on decode ranks. Errors are JSON ``{"error": "<one line>"}`` with the
``RpcError`` status (other ``TorchInfernoError``: 400; a bug: 500 with its one line, the rank keeps serving).
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from torchinferno.errors import TorchInfernoError
from torchinferno.runtime.disagg_wire import (
    CONTENT_TYPE,
    RpcError,
    decode_json,
    decode_message,
    encode_message,
)

__all__ = [
    "DisaggError",
    "DisaggResult",
    "RankClient",
    "RankRefused",
    "RankUnreachable",
    "make_server",
    "run_disagg_request",
    "serve_rank",
    "start_ttl_sweeper",
]


def _one_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


_ROLE_ROUTES = {"/prefill": "prefill", "/kv": "prefill", "/decode": "decode"}


def make_server(rank, host: str, port: int) -> ThreadingHTTPServer:
    """A server (not yet serving) dispatching the RPC routes to ``rank``'s methods."""
    max_body = rank.config.max_body_bytes

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "torchinferno-disagg/1"
        timeout = 60  # seconds a connection may stall (a body shorter than its Content-Length) before it is dropped

        def log_message(self, fmt, *args):  # quiet: the rank prints one ready line; errors come back to callers
            pass

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: dict) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json")

        def _body(self) -> bytes:
            n = self.headers.get("Content-Length")
            if n is None:
                raise RpcError(411, "a Content-Length header is required")
            try:
                n = int(n)
            except ValueError:
                raise RpcError(400, f"Content-Length must be an integer, got {n!r:.40}") from None
            if n < 0 or n > max_body:
                raise RpcError(413, f"body of {n} bytes exceeds this rank's limit of {max_body} bytes")
            body = self.rfile.read(n)
            if len(body) != n:
                raise RpcError(400, f"body is truncated: Content-Length {n}, {len(body)} bytes arrived")
            return body

        def _dispatch(self, method: str) -> None:
            route = self.path.split("?", 1)[0].rstrip("/")
            try:
                if method == "GET" and route == "/health":
                    return self._json(200, rank.health())
                if method != "POST" or route not in ("/prefill", "/kv", "/decode", "/release"):
                    raise RpcError(404, f"no route {method} {route or '/'} (routes: GET /health, POST /prefill, "
                                        "POST /kv, POST /decode, POST /release)")
                if route in _ROLE_ROUTES and _ROLE_ROUTES[route] != rank.config.role:
                    raise RpcError(404, f"POST {route} is served by {_ROLE_ROUTES[route]} ranks; this is "
                                        f"{rank.config.role} rank {rank.config.rank}")
                body = self._body()
                if route == "/decode":
                    control, tensors = decode_message(body, "decode request")
                    return self._json(200, rank.decode(control, tensors))
                control = decode_json(body, f"{route[1:]} request")
                if route == "/release":
                    return self._json(200, rank.release(control))
                reply, tensors = (rank.prefill if route == "/prefill" else rank.kv)(control)
                return self._send(200, encode_message(reply, tensors), CONTENT_TYPE)
            except RpcError as e:
                rank.stats.refused += 1
                self._json(e.status, {"error": _one_line(e)})
            except TorchInfernoError as e:
                rank.stats.refused += 1
                self._json(400, {"error": _one_line(e)})
            except Exception as e:  # noqa: BLE001 -- a bug: answer it in one line and keep serving
                self._json(500, {"error": f"internal error: {type(e).__name__}: {_one_line(e)}"})

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def start_ttl_sweeper(rank) -> threading.Event:
    """A daemon thread freeing ``rank``'s expired held KV even when no RPC arrives (every ``kv_ttl_s / 4``, at most
    1 s); set the returned event to stop it."""
    stop = threading.Event()

    def sweep() -> None:
        while not stop.wait(min(1.0, rank.config.kv_ttl_s / 4)):
            rank.expire()

    threading.Thread(target=sweep, daemon=True, name="disagg-ttl").start()
    return stop


def serve_rank(rank_cls, config, argv: list[str] | None = None, prog: str | None = None) -> int:
    """A rank file's ``main``: optional ``--host/--port/--kv-ttl-s/--num-blocks/--threads`` overrides, build the rank, serve
    until SIGTERM/SIGINT. Expected failures (no CUDA, bad config, port taken) print one line and return 1."""
    prog = prog or sys.argv[0]
    p = argparse.ArgumentParser(prog=prog, description=f"disaggregated {config.role} rank {config.rank}")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--kv-ttl-s", type=float, default=None, help="free held prefill KV after this long without /release")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    a = p.parse_args(argv)
    if a.threads is not None:
        import torch

        torch.set_num_threads(max(1, a.threads))
    config = config.with_overrides(host=a.host, port=a.port, kv_ttl_s=a.kv_ttl_s, num_blocks=a.num_blocks)
    try:
        rank = rank_cls(config)
        server = make_server(rank, config.host, config.port)
    except (TorchInfernoError, OSError) as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr, flush=True)
        return 1
    stop = start_ttl_sweeper(rank)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    src = config.model or f"tiny random {rank.family.name} (size {config.size}, seed {config.seed})"
    print(f"{config.role} rank {config.rank} serving http://{config.host}:{server.server_address[1]} "
          f"model={src} device={config.device} kv={str(rank.kv_dtype).removeprefix('torch.')} blocks={config.num_blocks}x{config.block_size}",
          flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
    return 0


# ---------------------------------------------------------------------------------------------------- client
class RankUnreachable(TorchInfernoError):
    """The rank did not answer (refused, reset, timed out or closed the connection mid-request)."""


class RankRefused(TorchInfernoError):
    """The rank answered with an error status (its one-line message is kept)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class DisaggError(TorchInfernoError):
    """A disaggregated request failed; the message says where and what was cleaned up."""


class RankClient:
    """Blocking calls to one rank (``url`` like ``http://127.0.0.1:8800``)."""

    def __init__(self, url: str, timeout_s: float = 120.0):
        u = urlsplit(url if "//" in url else f"http://{url}")
        if u.scheme != "http" or not u.hostname or not u.port:
            raise TorchInfernoError(f"rank URL must look like http://HOST:PORT, got '{url}'")
        self.url, self.host, self.port, self.timeout_s = f"http://{u.hostname}:{u.port}", u.hostname, u.port, timeout_s

    def call(self, method: str, path: str, body: bytes | None = None,
             ctype: str = "application/json") -> tuple[bytes, str, int]:
        """(reply body, reply content type, bytes sent + received); ``RankRefused`` on a status >= 400."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            headers = {"Content-Type": ctype} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise RankUnreachable(f"no answer from {self.url}{path}: {type(e).__name__}: {_one_line(e)}") from None
        finally:
            conn.close()
        if resp.status >= 400:
            try:
                msg = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                msg = data[:200].decode("utf-8", "replace")
            raise RankRefused(resp.status, f"{self.url}{path} -> {resp.status}: {msg}")
        return data, resp.getheader("Content-Type", ""), len(body or b"") + len(data)

    def json(self, path: str, obj: dict | None = None) -> dict:
        data, _, _ = self.call("GET" if obj is None else "POST", path, None if obj is None else json.dumps(obj).encode())
        return json.loads(data)

    def health(self) -> dict:
        return self.json("/health")

    def prefill(self, request_id: str, prompt: list[int], sampling: dict) -> tuple[dict, dict, int]:
        data, _, n = self.call("POST", "/prefill", json.dumps(
            {"request_id": request_id, "prompt_token_ids": prompt, "sampling": sampling}).encode())
        control, tensors = decode_message(data, "prefill reply")
        return control, tensors, n

    def decode(self, control: dict, tensors: dict) -> tuple[dict, int]:
        data, _, n = self.call("POST", "/decode", encode_message(control, tensors), CONTENT_TYPE)
        return json.loads(data), n

    def release(self, request_id: str) -> dict:
        return self.json("/release", {"request_id": request_id})


@dataclass
class DisaggResult:
    """One request through a prefill rank and a decode rank."""

    request_id: str
    token_ids: list[int]
    finish_reason: str
    kv_bytes: int  # KV tensor bytes moved prefill -> decode (== prompt tokens x KVSpec bytes per token)
    wire_bytes: int  # HTTP body bytes the driver sent and received over both RPCs (framing, JSON, safetensors)
    timings: dict[str, float] = field(default_factory=dict)


def run_disagg_request(prefill: RankClient, decode: RankClient, prompt: list[int], sampling: dict[str, Any],
                       request_id: str | None = None) -> DisaggResult:
    """Prefill on ``prefill``, hand the KV to ``decode``, release the prefill rank's copy. If the decode rank fails
    (unreachable, killed mid-request, or refuses), the prefill rank's KV is released before ``DisaggError``."""
    rid = request_id or f"req-{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    control, tensors, n_pre = prefill.prefill(rid, prompt, sampling)
    t1 = time.perf_counter()
    timings = {"prefill_rpc_s": t1 - t0, "prefill_s": control.get("prefill_s", 0.0), "pack_s": control.get("pack_s", 0.0)}
    if control.get("finish_reason"):  # finished on its first token: nothing held, nothing to hand off
        return DisaggResult(rid, [control["first_token"]], control["finish_reason"], 0, n_pre, timings)
    try:
        reply, n_dec = decode.decode({"request_id": rid, "model_id": control.get("model_id"), "prompt_token_ids": prompt,
                                      "first_token": control["first_token"], "sampling": sampling}, tensors)
    except (RankUnreachable, RankRefused) as e:
        try:
            freed = prefill.release(rid).get("freed_blocks", 0)
            cleanup = f"released its KV on the prefill rank ({freed} blocks)"
        except TorchInfernoError as e2:
            cleanup = f"releasing its KV on the prefill rank failed too ({_one_line(e2)}; its TTL frees it)"
        raise DisaggError(f"request {rid}: decode rank failed: {_one_line(e)}; {cleanup}") from None
    t2 = time.perf_counter()
    prefill.release(rid)
    timings.update(decode_rpc_s=t2 - t1, unpack_s=reply.get("unpack_s", 0.0), decode_s=reply.get("decode_s", 0.0),
                   total_s=time.perf_counter() - t0)
    return DisaggResult(rid, reply["token_ids"], reply["finish_reason"], int(control["kv_bytes"]),
                        n_pre + n_dec, timings)
