"""``torchinferno router``: one OpenAI-compatible front over several remote OpenAI-compatible workers.

Each request to ``/v1/completions`` or ``/v1/chat/completions`` goes to one worker, chosen by a routing policy
(``engine.route_policy``: round-robin, least-loaded, cache-aware) over the workers that are in rotation. The router
never tokenizes: the cache-aware policy's prefix trees hold the UTF-8 bytes of the request's prompt text (completions:
the prompt; chat: each message as ``role\\ncontent\\n``, in order, so a conversation's next turn extends its previous
one); its load is the requests this router has in flight on each worker. A finished non-streamed request also teaches
the tree its completion (the worker caches it too).

Faults:

* a health probe (``GET /health``, every ``health_interval_s``) takes a worker out of rotation when it fails and back
  when it answers again; a worker whose connection fails while a request is sent is taken out at once too;
* a request whose worker fails *before anything was sent back* (connection refused or reset, no response, or a 503
  from a draining / dead worker) is retried on another worker in rotation (each worker at most once);
* a stream whose worker fails *after* its 200 ends with an OpenAI error event, then ``data: [DONE]``;
* nothing in rotation: 503 with one line (``no worker available``).

``/v1/models`` is the first live worker's; ``/health`` is 200 while any worker is in rotation; ``/metrics`` shows each
worker's state (in rotation, requests in flight, routed, failures) and the router's prefix hit rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from torchinferno.engine.route_policy import ReplicaState, RoutingPolicy
from torchinferno.server.protocol import BadRequest

__all__ = ["RouterConfig", "Worker", "create_router_app", "prompt_key"]

_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
              httpx.WriteError, httpx.PoolTimeout)


@dataclass
class RouterConfig:
    workers: list[str]
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0
    max_body_bytes: int = 16 * 1024 * 1024


@dataclass
class Worker:
    url: str
    alive: bool = True
    in_flight: int = 0
    failures: int = 0


def prompt_key(path: str, body: dict) -> list[int]:
    """The bytes the cache-aware policy matches on (module docstring)."""
    if path.endswith("chat/completions"):
        text = "".join(f"{m.get('role', '')}\n{_content(m.get('content'))}\n" for m in body.get("messages") or []
                       if isinstance(m, dict))
    else:
        p = body.get("prompt", "")
        text = p if isinstance(p, str) else json.dumps(p)
    return list(text.encode("utf-8", "replace"))


def _content(c) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return ""


def _error(message: str, status: int, code: str) -> JSONResponse:
    return JSONResponse(BadRequest(message, status=status, type_="server_error", code=code).body(), status_code=status)


def create_router_app(cfg: RouterConfig, policy: RoutingPolicy) -> FastAPI:
    if not cfg.workers:
        raise ValueError("the router needs at least one worker")
    workers = [Worker(u.rstrip("/")) for u in cfg.workers]
    reg = CollectorRegistry()
    g_alive = Gauge("torchinferno_router_worker_up", "1 while the worker is in rotation", ["worker"], registry=reg)
    g_flight = Gauge("torchinferno_router_worker_in_flight", "Requests in flight on the worker", ["worker"], registry=reg)
    c_fail = Counter("torchinferno_router_worker_failures", "Requests or probes that failed on the worker", ["worker"],
                     registry=reg)
    g_routed = Gauge("torchinferno_router_worker_requests_routed", "Requests routed to the worker (cumulative)",
                     ["worker"], registry=reg)
    c_retry = Counter("torchinferno_router_retries", "Requests retried on another worker", registry=reg)
    g_hit = Gauge("torchinferno_router_prefix_hit_rate", "Prompt bytes found in the chosen worker's prefix tree / "
                  "prompt bytes routed", ["policy"], registry=reg)
    state: dict = {"client": None, "probe": None}

    def mark(i: int, alive: bool) -> None:
        w = workers[i]
        if w.alive and not alive:
            policy.replica_died(i)
        w.alive = alive

    def fail(i: int) -> None:
        workers[i].failures += 1
        c_fail.labels(workers[i].url).inc()
        mark(i, False)

    async def probe_once() -> None:
        client: httpx.AsyncClient = state["client"]

        async def one(i: int) -> None:
            try:
                r = await client.get(workers[i].url + "/health", timeout=cfg.health_timeout_s)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok and workers[i].alive:
                fail(i)
            elif ok:
                mark(i, True)

        await asyncio.gather(*(one(i) for i in range(len(workers))))

    async def probe_loop() -> None:
        while True:
            await asyncio.sleep(cfg.health_interval_s)
            await probe_once()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s),
                                            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        state["probe"] = asyncio.get_running_loop().create_task(probe_loop())
        try:
            yield
        finally:
            state["probe"].cancel()
            await state["client"].aclose()

    app = FastAPI(title="TorchInferno router", lifespan=lifespan)
    app.state.workers, app.state.policy, app.state.probe_once = workers, policy, probe_once

    def pick(key: list[int], tried: set[int]) -> int | None:
        states = [ReplicaState(w.in_flight, 0.0, w.alive and i not in tried) for i, w in enumerate(workers)]
        if not any(s.alive for s in states):
            return None
        return policy.route(key, states).replica

    def learn(i: int, path: str, body: dict, key: list[int], resp: dict) -> None:
        try:
            ch = resp["choices"][0]
            text = ch["message"]["content"] if path.endswith("chat/completions") else ch["text"]
        except (KeyError, IndexError, TypeError):
            return
        if not isinstance(text, str):
            return
        extra = f"assistant\n{text}\n" if path.endswith("chat/completions") else text
        policy.finished(i, key + list(extra.encode("utf-8", "replace")))

    async def forward(request: Request, path: str):
        raw = await request.body()
        if len(raw) > cfg.max_body_bytes:
            return JSONResponse(BadRequest(f"request body larger than {cfg.max_body_bytes} bytes", status=413).body(),
                                status_code=413)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse(BadRequest("the request body is not valid JSON").body(), status_code=400)
        if not isinstance(body, dict):
            return JSONResponse(BadRequest("the request body must be a JSON object").body(), status_code=400)
        key = prompt_key(path, body)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        client: httpx.AsyncClient = state["client"]
        tried: set[int] = set()
        while True:
            i = pick(key, tried)
            if i is None:
                return _error("no worker available (every worker failed or is out of rotation)", 503,
                              "no_worker_available")
            if tried:
                c_retry.inc()
            tried.add(i)
            w = workers[i]
            w.in_flight += 1
            try:
                req = client.build_request("POST", w.url + path, content=raw, headers=headers)
                resp = await client.send(req, stream=True)
            except _RETRYABLE:
                w.in_flight -= 1
                fail(i)
                continue
            except httpx.TimeoutException:  # connected, but no response head in time: it may be generating
                w.in_flight -= 1
                return _error(f"worker {w.url} did not answer within {cfg.request_timeout_s:g} s", 504,
                              "worker_timeout")
            except BaseException:
                w.in_flight -= 1
                raise
            if resp.status_code == 503:  # draining or its engine died: nothing was generated, try another
                await resp.aclose()
                w.in_flight -= 1
                fail(i)
                continue
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                return StreamingResponse(_relay(resp, i), status_code=resp.status_code,
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            try:
                data = await resp.aread()
            except _RETRYABLE:  # died before the answer came back: nothing reached the client yet
                w.in_flight -= 1
                fail(i)
                continue
            except httpx.TimeoutException:
                w.in_flight -= 1
                return _error(f"worker {w.url} did not answer within {cfg.request_timeout_s:g} s", 504,
                              "worker_timeout")
            finally:
                await resp.aclose()
            w.in_flight -= 1
            if resp.status_code == 200:
                with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
                    learn(i, path, body, key, json.loads(data))
            return Response(data, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type", "application/json"))

    async def _relay(resp: httpx.Response, i: int):
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except _RETRYABLE + (httpx.ReadTimeout,):
            fail(i)
            err = BadRequest(f"worker {workers[i].url} failed mid-stream", status=502, type_="server_error",
                             code="worker_failed")
            yield f"data: {json.dumps(err.body())}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            workers[i].in_flight -= 1
            await resp.aclose()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await forward(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request):
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        for i, w in enumerate(workers):
            if not w.alive:
                continue
            try:
                r = await state["client"].get(w.url + "/v1/models", headers=headers, timeout=cfg.health_timeout_s * 5)
            except httpx.HTTPError:
                fail(i)
                continue
            return Response(r.content, status_code=r.status_code, media_type="application/json")
        return _error("no worker available", 503, "no_worker_available")

    @app.get("/health")
    async def health():
        if any(w.alive for w in workers):
            return Response(status_code=200)
        return _error("no worker available", 503, "no_worker_available")

    @app.get("/metrics")
    async def metrics():
        for i, w in enumerate(workers):
            g_alive.labels(w.url).set(int(w.alive))
            g_flight.labels(w.url).set(w.in_flight)
            g_routed.labels(w.url).set(policy.stats.per_replica[i])
        g_hit.labels(policy.name).set(policy.stats.hit_rate)
        return PlainTextResponse(generate_latest(reg), media_type="text/plain; version=0.0.4")

    return app
