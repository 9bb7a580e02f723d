"""FastAPI app: OpenAI-compatible routes over an ``AsyncEngine``.

Boundary rules: every body is decoded and validated here (bad input -> 4xx OpenAI error object,
never an exception in the engine loop); a client that disconnects has its request aborted so
its KV blocks are freed; the engine runs in its own thread, so no handler blocks the event loop.

Every error body is an OpenAI error object ``{"error": {"message", "type", "param", "code"}}``:
4xx for bad input, 404/405 for unknown routes, 503 once the engine thread is not running (``/health``
answers 503 too, so a supervisor can restart the server), 500 for anything unexpected; each is counted in
``torchinferno_request_errors`` by status. A stream that fails after its 200 ends with an error event.
"""

from __future__ import annotations

import hmac
import os
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from torchinferno import __version__
from torchinferno.core.generation_defaults import SamplingDefaults
from torchinferno.errors import EngineDeadError
from torchinferno.errors import TorchInfernoError
from torchinferno.server import completions
from torchinferno.server.body import MAX_BODY_BYTES, ErrorMiddleware, read_json_body
from torchinferno.server.metrics import ServerMetrics
from torchinferno.server.protocol import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    as_openai_error,
    check_text,
)


@dataclass
class ServerConfig:
    model_name: str
    root: str
    max_model_len: int
    api_key: str | None = None
    max_request_body_bytes: int = MAX_BODY_BYTES
    max_choices_per_request: int = completions.MAX_CHOICES
    sampling_defaults: SamplingDefaults = SamplingDefaults()  # --generation-config

    def public_root(self) -> str:
        """What ``/v1/models`` shows as ``root``: never an absolute local path (the cache layout is private)."""
        return self.model_name if os.path.isabs(self.root) else self.root


def error_response(e: BadRequest) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def parse_body(request: Request, schema: type[BaseModel]) -> BaseModel:
    data = await read_json_body(request, request.app.state.config.max_request_body_bytes)
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise BadRequest(f"invalid value for '{loc}': {err.get('msg')}", loc or None) from None


class ApiKeyMiddleware:
    """Every route but ``/health`` (the supervisor's probe) needs ``Authorization: Bearer KEY``: the API, tokenize,
    metrics, version, docs and the OpenAPI schema. Pure ASGI (not BaseHTTPMiddleware, which hides client
    disconnects from handlers)."""

    OPEN = frozenset({"/health"})

    def __init__(self, app, api_key: str, on_reject=None):
        self.app, self.expected, self.on_reject = app, f"Bearer {api_key}".encode(), on_reject

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.OPEN:
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(auth, self.expected):
                if self.on_reject:
                    self.on_reject()
                e = BadRequest("missing or invalid API key", status=401, type_="authentication_error", code="invalid_api_key")
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine, tokenizer, cfg: ServerConfig) -> FastAPI:
    """Build the app. ``engine`` is an ``AsyncEngine``; ``tokenizer`` a ``text.Tokenizer``."""
    app = FastAPI(title="TorchInferno OpenAI-compatible server", version=__version__)
    metrics = ServerMetrics(cfg.model_name)
    if hasattr(engine, "bind_metrics"):  # engine-specific collectors (disaggregation: KV transfer bytes / seconds)
        engine.bind_metrics(metrics)
    app.state.engine, app.state.metrics, app.state.config, app.state.tokenizer = engine, metrics, cfg, tokenizer
    app.state.draining = False  # set on SIGTERM (server.launch): new requests get 503
    ctx = completions.Context(engine, tokenizer, cfg.model_name, cfg.max_model_len, metrics,
                              max_choices=cfg.max_choices_per_request, defaults=cfg.sampling_defaults)

    # Added last = outermost: the key is checked first; a bug anywhere inside becomes a counted JSON 500.
    app.add_middleware(ErrorMiddleware, on_error=lambda e: metrics.bad_requests.labels(cfg.model_name, "500").inc())
    if cfg.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=cfg.api_key, on_reject=lambda: metrics.bad_requests.labels(cfg.model_name, "401").inc())

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, e: BadRequest):
        metrics.bad_requests.labels(cfg.model_name, str(e.status)).inc()
        return error_response(e)

    @app.exception_handler(TorchInfernoError)  # bad input -> 400
    @app.exception_handler(EngineDeadError)  # the engine thread stopped -> 503; a bug -> ErrorMiddleware's 500
    async def openai_error(_: Request, e: Exception):
        err = as_openai_error(e)
        metrics.bad_requests.labels(cfg.model_name, str(err.status)).inc()
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException):  # unknown route (404), wrong method (405)
        metrics.bad_requests.labels(cfg.model_name, str(e.status_code)).inc()
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        resp = error_response(BadRequest(str(e.detail), status=e.status_code, code=code))
        for k, v in (e.headers or {}).items():
            resp.headers[k] = v
        return resp

    def unavailable() -> BadRequest | None:
        if app.state.draining:
            return BadRequest("the server is shutting down", status=503, type_="service_unavailable",
                              code="shutting_down")
        if not engine.is_running:
            return as_openai_error(EngineDeadError("the engine is not running"))
        return None

    def check_engine() -> None:
        err = unavailable()
        if err is not None:
            raise err

    def check_model(name: str | None) -> None:
        if name is not None and name not in (cfg.model_name, cfg.public_root()):
            raise BadRequest(f"The model '{name}' does not exist (served: '{cfg.model_name}')", "model", status=404,
                             type_="NotFoundError", code="model_not_found")

    @app.get("/health")
    async def health() -> Response:
        err = unavailable()
        if err is not None:
            return error_response(err)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": cfg.model_name, "object": "model", "created": int(time.time()), "owned_by": "torchinferno",
            "root": cfg.public_root(), "parent": None, "max_model_len": cfg.max_model_len,
        }]}

    @app.get("/metrics")
    async def prom() -> Response:
        metrics.refresh(engine.stats())
        metrics.refresh_replicas(engine)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        req = await parse_body(request, TokenizeRequest)
        check_model(req.model)
        if req.messages is not None:
            msgs = [{"role": m.role, "content": m.text()} for m in req.messages]
            check_text([m["content"] for m in msgs], "messages")
            ids = tokenizer.encode_chat(msgs, add_generation_prompt=req.add_generation_prompt)
        elif req.prompt is not None:
            check_text(req.prompt, "prompt")
            ids = tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            raise BadRequest("either 'prompt' or 'messages' is required", "prompt")
        return {"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        req = await parse_body(request, DetokenizeRequest)
        check_model(req.model)
        completions.check_token_ids(req.tokens, tokenizer.vocab_size, "tokens")
        return {"prompt": tokenizer.decode(req.tokens, skip_special_tokens=False)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req = await parse_body(request, ChatCompletionRequest)
        check_model(req.model)
        check_engine()  # before a stream starts with 200
        return await ctx.chat(req, request, f"chatcmpl-{uuid.uuid4().hex}")

    @app.post("/v1/completions")
    async def complete(request: Request):
        req = await parse_body(request, CompletionRequest)
        check_model(req.model)
        check_engine()
        return await ctx.completion(req, request, f"cmpl-{uuid.uuid4().hex}")

    return app


__all__ = ["create_app", "ServerConfig", "StreamingResponse"]
