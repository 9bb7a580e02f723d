"""OpenAI request bodies, validated at the boundary.

Validation raises :class:`BadRequest` (-> HTTP 400 with an OpenAI error object) so nothing
invalid reaches the engine loop. Unknown extra fields are tolerated (ignored), as clients such
as ``vllm bench serve`` send vendor extensions.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from torchinferno.core.generation_defaults import UNIMPLEMENTED, SamplingDefaults
from torchinferno.core.sampling_params import SamplingParams

MAX_N = 16
Number = Union[StrictInt, StrictFloat]


class BadRequest(Exception):
    """A 4xx with an OpenAI error body. ``param`` names the offending field when known."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def as_openai_error(e: BaseException) -> BadRequest:
    """The OpenAI error object for any failure: ``BadRequest`` as is, bad input (``TorchInfernoError``) 400,
    the engine thread gone (``EngineDeadError``) 503, anything else (a bug) 500."""
    from torchinferno.errors import EngineDeadError, TorchInfernoError

    if isinstance(e, BadRequest):
        return e
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, EngineDeadError):
        return BadRequest(f"{msg}; the server cannot generate any more (restart it)", status=503,
                          type_="server_error", code="engine_not_running")
    if isinstance(e, TorchInfernoError):
        return BadRequest(msg)
    return BadRequest(f"internal server error ({type(e).__name__}: {msg})", status=500, type_="server_error",
                      code="internal_error")


# fields accepted only at their neutral value (never silently ignored: the caller would believe they applied)
UNSUPPORTED_NEUTRAL: dict[str, Any] = {**{k: UNIMPLEMENTED[k] for k in ("presence_penalty", "frequency_penalty",
                                                                        "repetition_penalty")}, "logit_bias": {}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Optional[StrictBool] = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = None
    temperature: Optional[Number] = None
    top_p: Optional[Number] = None
    top_k: Optional[StrictInt] = None
    min_p: Optional[Number] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    stop_token_ids: Optional[list[StrictInt]] = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: StrictBool = False
    user: Optional[str] = None
    priority: StrictInt = 0  # lower first, under serve --scheduling-policy priority (vLLM's field)
    # OpenAI / vLLM fields this engine does not implement: accepted at their neutral value, else a 400 naming them
    # (never silently ignored: the caller would believe they applied)
    presence_penalty: Optional[Number] = None
    frequency_penalty: Optional[Number] = None
    repetition_penalty: Optional[Number] = None
    logit_bias: Optional[dict[str, Any]] = None

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: Optional[StrictStr] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Optional[Union[StrictStr, list[ContentPart]]] = None
    name: Optional[StrictStr] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text":
                raise BadRequest(f"unsupported content part type '{p.type}' (only 'text')", "messages")
            parts.append(p.text or "")
        return "".join(parts)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[StrictInt] = None
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = None
    add_generation_prompt: StrictBool = True


class CompletionRequest(_Common):
    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    logprobs: Optional[StrictInt] = None
    echo: StrictBool = False
    suffix: Optional[StrictStr] = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[StrictStr] = None
    tokens: list[StrictInt]


def check_text(value: Any, param: str) -> None:
    """Reject lone surrogates (JSON '\\ud800' escapes) that cannot be encoded as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"'{param}' contains invalid Unicode (lone surrogate)", param) from None
    elif isinstance(value, list):
        for v in value:
            check_text(v, param)


def sampling_params(req: _Common, max_tokens: int | None, default_max_tokens: int, logprobs: int | None,
                    defaults: SamplingDefaults = SamplingDefaults()) -> SamplingParams:
    """Map and validate OpenAI fields -> SamplingParams (raises BadRequest naming the field). Every float
    field must be finite (the body decoder rejects NaN/Infinity already; this holds for any caller). A field the
    request leaves out takes ``defaults`` (the model's generation_config.json), else the OpenAI default."""
    for name in ("temperature", "top_p", "min_p"):
        v = getattr(req, name)
        if v is not None and not math.isfinite(v):
            raise BadRequest(f"{name} must be a finite number, got {v}", name)
    for name, neutral in UNSUPPORTED_NEUTRAL.items():
        v = getattr(req, name)
        if v is not None and v != neutral:
            raise BadRequest(f"{name} is not supported by this server (only {neutral!r} or leaving it out)", name)
    if req.stream_options is not None and not req.stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if req.n < 1 or req.n > MAX_N:
        raise BadRequest(f"n must be between 1 and {MAX_N}, got {req.n}", "n")
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    if req.temperature is not None and req.temperature < 0:
        raise BadRequest(f"temperature must be >= 0, got {req.temperature}", "temperature")
    if req.top_p is not None and not (0 < req.top_p <= 1):
        raise BadRequest(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if req.top_k is not None and req.top_k < -1:
        raise BadRequest(f"top_k must be -1 or 0 (off) or >= 1, got {req.top_k}", "top_k")
    if req.min_p is not None and not (0 <= req.min_p <= 1):
        raise BadRequest(f"min_p must be in [0, 1], got {req.min_p}", "min_p")
    if logprobs is not None and not (0 <= logprobs <= 20):
        raise BadRequest(f"logprobs/top_logprobs must be in [0, 20], got {logprobs}", "logprobs")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(s == "" for s in stop):
        raise BadRequest("stop strings must be non-empty", "stop")
    check_text(stop, "stop")
    if req.stop_token_ids and any(t < 0 for t in req.stop_token_ids):
        raise BadRequest("stop_token_ids must be non-negative", "stop_token_ids")
    base = defaults.sampling_params()  # SamplingParams' own defaults where the model's file sets none

    def pick(value, default):
        return default if value is None else value

    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=float(pick(req.temperature, base.temperature)),
        top_p=float(pick(req.top_p, base.top_p)),
        top_k=-1 if req.top_k == 0 else pick(req.top_k, base.top_k),
        min_p=float(pick(req.min_p, base.min_p)),
        seed=req.seed,
        stop=stop,
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        n=req.n,
        logprobs=logprobs,
        priority=req.priority,
    )
