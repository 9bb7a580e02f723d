"""Request bodies read and decoded defensively, and the error middleware that turns any bug into a JSON 500.

Invariants of :func:`read_json_body` (every failure is a :class:`BadRequest`, never another exception):

* a body over ``max_bytes`` -> 413 (checked on ``Content-Length`` before reading, and while reading a
  chunked body, so a huge body is never held in memory);
* not UTF-8, not JSON, or not a JSON object -> 400;
* nesting deeper than ``MAX_DEPTH`` arrays/objects -> 400 (the C decoder's ``RecursionError`` included);
* an integer outside signed 64 bits (however many digits) -> 400 naming the field;
* ``NaN``, ``Infinity``, ``-Infinity`` or a float literal that overflows to infinity (``1e999``) -> 400
  naming the field (they are not JSON, and a non-finite temperature or top_p samples garbage).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from torchinferno.server.protocol import BadRequest, as_openai_error

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_MAX_INT_CHARS = 20  # "-9223372036854775808" is 20 characters; longer digit strings are never converted


class _Rejected:
    """A literal the decoder must not turn into a value; found with its field path after decoding."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def _parse_int(s: str):
    if len(s) > _MAX_INT_CHARS:
        return _Rejected(f"an integer of {len(s.lstrip('-'))} digits is outside the 64-bit range")
    v = int(s)
    if not INT64_MIN <= v <= INT64_MAX:
        return _Rejected(f"{s} is outside the 64-bit integer range")
    return v


def _parse_float(s: str):
    v = float(s)
    if not math.isfinite(v):
        return _Rejected(f"{s[:32]} overflows to infinity (numbers must be finite)")
    return v


def _parse_constant(s: str):
    return _Rejected(f"{s} is not a valid JSON number (numbers must be finite)")


def _check_tree(data: Any) -> None:
    """Depth limit and rejected literals, walked iteratively (no recursion on hostile input)."""
    stack: list[tuple[Any, tuple, int]] = [(data, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, _Rejected):
            field = ".".join(str(p) for p in path) or None
            raise BadRequest(f"invalid value for '{field}': {node.why}", field)
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise BadRequest(f"the JSON body is nested deeper than {MAX_DEPTH} levels")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((v, (*path, k), depth + 1) for k, v in items)


def decode_json_object(raw: bytes) -> dict:
    """Bytes -> a JSON object with only finite floats and 64-bit integers (module docstring)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8") from None
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as e:
        raise BadRequest(f"malformed JSON body: {e.msg} at position {e.pos}") from None
    except RecursionError:
        raise BadRequest(f"the JSON body is nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    _check_tree(data)
    return data


def _too_large(max_bytes: int) -> BadRequest:
    return BadRequest(f"request body is larger than {max_bytes} bytes (--max-request-body-bytes)", status=413,
                      code="request_too_large")


async def read_json_body(request, max_bytes: int = MAX_BODY_BYTES) -> dict:
    """Read a Starlette request's body with a size cap and decode it (module docstring)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return decode_json_object(b"".join(chunks))


class ErrorMiddleware:
    """Pure ASGI: an exception that escapes a route becomes an OpenAI-shaped JSON 500 (counted by ``on_error``),
    and the connection stays usable (Starlette's own handler re-raises, which resets keep-alive). If the
    response had already started, the exception is swallowed after ``on_error`` (the body cannot change)."""

    def __init__(self, app, on_error: Callable[[BaseException], None] | None = None):
        self.app, self.on_error = app, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as e:  # noqa: BLE001 - the boundary: nothing escapes to uvicorn
            import traceback

            traceback.print_exc()
            if self.on_error is not None:
                self.on_error(e)
            if started:
                return
            from fastapi.responses import JSONResponse

            err = as_openai_error(e)
            await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
