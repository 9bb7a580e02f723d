"""Plain data between the API side (tokenizer, text, HTTP) and the engine core (scheduler + executor).

Every message that crosses the process boundary is one of these ``msgspec`` structs, encoded as
msgpack arrays (``array_like``: field names are not sent). The engine core speaks tokens only:
text, stop strings and detokenization stay on the API side.

One ``EngineCoreOutputs`` message carries everything one engine step produced, for every request
that advanced in it (one small struct per request per step, never one object per token).
"""

from __future__ import annotations

from typing import Union

import msgspec

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.outputs import TokenLogprob

__all__ = ["EngineCoreRequest", "EngineCoreOutput", "EngineCoreOutputs", "CoreInfo", "FinishRequests",
           "UtilityCall", "UtilityResult", "Shutdown", "ToCore", "FromCore", "encoder", "to_core_decoder",
           "from_core_decoder"]


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, tag="req"):
    """A request as the core sees it: already validated and tokenized on the API side."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float | None = None


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one request got from one step.

    ``finish_reason`` is ``"stop"`` (a stop token: ``stop_reason`` is its id), ``"length"``,
    ``"abort"``, or ``None`` while the request runs. ``logprobs[i]`` belongs to
    ``new_token_ids[i]`` (present only when the request asked for logprobs). ``prompt_logprobs[i]`` belongs to
    prompt token ``i + 1``; only in a ``prompt_logprobs`` request's first output.
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | None = None
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, tag="out"):
    """One step's outputs plus a statistics snapshot (``EngineStats.as_list``) taken after it."""

    outputs: list[EngineCoreOutput] = []
    stats: list | None = None
    error: str | None = None  # the core failed; it sends this, then exits


class FinishRequests(msgspec.Struct, array_like=True, tag="fin"):
    """Finish live requests now (abort, or a stop string the API side found); frees their blocks."""

    request_ids: list[str]
    status: str = "abort"  # "abort" | "stop"


class UtilityCall(msgspec.Struct, array_like=True, tag="call"):
    """A named call on the core answered by one ``UtilityResult`` (e.g. ``cached_prefix_tokens``)."""

    call_id: int
    method: str
    args: list = []


class UtilityResult(msgspec.Struct, array_like=True, tag="res"):
    call_id: int
    result: object = None
    error: str | None = None


class CoreInfo(msgspec.Struct, array_like=True, tag="info"):
    """Facts the API side needs before it can validate requests (sent once, when the core is ready)."""

    max_model_len: int
    vocab_size: int | None
    eos_token_ids: list[int]
    num_blocks: int
    block_size: int
    max_logprobs: int
    description: str
    pid: int = 0


class Shutdown(msgspec.Struct, array_like=True, tag="bye"):
    """Stop the core loop (in-flight requests are dropped; the API side has already ended them)."""


# The two directions of the transport, each a tagged union (the tag is the first array element).
ToCore = EngineCoreRequest | FinishRequests | UtilityCall | Shutdown
FromCore = EngineCoreOutputs | UtilityResult | CoreInfo


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def to_core_decoder(extra: tuple = ()) -> msgspec.msgpack.Decoder:
    """``extra``: more tagged message types (a disaggregated role's control messages, ``disagg.messages``)."""
    return msgspec.msgpack.Decoder(Union[(*ToCore.__args__, *extra)] if extra else ToCore)


def from_core_decoder(extra: tuple = ()) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(Union[(*FromCore.__args__, *extra)] if extra else FromCore)
