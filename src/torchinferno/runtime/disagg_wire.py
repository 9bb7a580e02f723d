"""Wire format of the rank files' local RPC (``runtime.disagg``): JSON control plus binary tensor payloads.

A *framed message* is one HTTP body (``Content-Type: application/x-torchinferno-disagg``)::

    b"TIDG" | u32 little-endian JSON length N | N bytes of UTF-8 JSON (an object) | safetensors bytes (may be empty)

The JSON object is the control message; the tail, when present, is a safetensors file
(``safetensors.torch.save``/``load``: a JSON header of names, dtypes, shapes and offsets, then raw buffers).
Nothing is ever pickled. Plain JSON requests and replies (``/health``, ``/release``, ``/prefill``'s request,
errors) are ordinary ``application/json`` bodies.

KV payload naming: ``layer.<i>.<name>`` for every layer ``i`` of the family's ``KVSpec`` and every tensor ``name``
of that layer's ``KVLayerSpec`` (GQA ``k``/``v``, MLA ``latent``, the DSA indexer's ``index_k``, DeepSeek-V4's
compressor rows, ...), each ``[num_tokens, *per_token_shape]`` in the cache's storage dtype: exactly the live
prompt tokens' rows, so the payload's tensor bytes are ``num_tokens * KVSpec.bytes_per_token(dtype)``.
``sampler.rng_state`` (uint8) optionally carries a seeded request's generator state after its first draw.

Every check here raises :class:`RpcError` (a ``TorchInfernoError``) carrying the HTTP status; the message is one
line naming the field or tensor.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

from torchinferno.errors import TorchInfernoError
from torchinferno.models.protocol import KVSpec

__all__ = [
    "CONTENT_TYPE",
    "MAGIC",
    "RNG_STATE_KEY",
    "RpcError",
    "check_kv_payload",
    "decode_json",
    "decode_message",
    "encode_message",
    "kv_payload_bytes",
    "kv_tensor_names",
]

MAGIC = b"TIDG"
CONTENT_TYPE = "application/x-torchinferno-disagg"
RNG_STATE_KEY = "sampler.rng_state"
_HEADER = struct.Struct("<4sI")


class RpcError(TorchInfernoError):
    """A request the rank refuses: ``status`` is the HTTP status (4xx: the caller's fault; 503: no room now)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def encode_message(control: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    """One framed body: ``control`` as JSON, ``tensors`` (host copies are made) as safetensors bytes."""
    from safetensors.torch import save

    head = json.dumps(control, separators=(",", ":")).encode()
    tail = b""
    if tensors:
        tail = save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()})
    return _HEADER.pack(MAGIC, len(head)) + head + tail


def decode_json(body: bytes, what: str = "request") -> dict[str, Any]:
    """A JSON object from ``body``; 400 naming ``what`` on anything else."""
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise RpcError(400, f"{what} body is not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(obj, dict):
        raise RpcError(400, f"{what} body must be a JSON object, got {type(obj).__name__}")
    return obj


def decode_message(body: bytes, what: str = "request") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(control, tensors)`` of a framed body; 400 on a bad magic, a truncated frame or unreadable safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    if len(body) < _HEADER.size:
        raise RpcError(400, f"{what} body is truncated: {len(body)} bytes, a frame header needs {_HEADER.size}")
    magic, n = _HEADER.unpack_from(body)
    if magic != MAGIC:
        raise RpcError(400, f"{what} body does not start with the frame magic {MAGIC!r} (got {magic!r})")
    if _HEADER.size + n > len(body):
        raise RpcError(400, f"{what} body is truncated: the JSON control part says {n} bytes, "
                            f"{len(body) - _HEADER.size} follow the header")
    control = decode_json(body[_HEADER.size:_HEADER.size + n], f"{what} control")
    tail = body[_HEADER.size + n:]
    if not tail:
        return control, {}
    try:
        tensors = load(bytes(tail))
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as e:
        raise RpcError(400, f"{what} tensor payload is not a readable safetensors file "
                            f"({len(tail)} bytes; truncated?): {str(e).splitlines()[0]}") from None
    return control, tensors


def kv_tensor_names(spec: KVSpec) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """``(payload name, layer index, tensor index, per-token shape)`` for every KV tensor of ``spec``, in order."""
    return [(f"layer.{i}.{name}", i, j, tuple(shape))
            for i, layer in enumerate(spec.layers) for j, (name, shape) in enumerate(layer.tensors)]


def kv_payload_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes of the KV tensors in a payload (``layer.*`` entries only: the live tokens' KV)."""
    return sum(t.numel() * t.element_size() for k, t in tensors.items() if k.startswith("layer."))


def check_kv_payload(tensors: dict[str, torch.Tensor], spec: KVSpec, dtype: torch.dtype, num_tokens: int) -> None:
    """Refuse (400, one line naming the tensor) a payload that is not exactly ``num_tokens`` rows of every KV tensor
    of ``spec`` in ``dtype``: a missing or unknown name, a wrong dtype or shape, or non-finite values."""
    want = {name: shape for name, _, _, shape in kv_tensor_names(spec)}
    extra = sorted(set(tensors) - set(want) - {RNG_STATE_KEY})
    if extra:
        raise RpcError(400, f"KV payload has unknown tensor '{extra[0]}' (expected layer.<i>.<name> of the model's KV spec)")
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise RpcError(400, f"KV payload is missing tensor '{name}'")
        if t.dtype != dtype:
            raise RpcError(400, f"KV tensor '{name}' has dtype {str(t.dtype).removeprefix('torch.')}, "
                                f"this rank stores {str(dtype).removeprefix('torch.')}")
        if tuple(t.shape) != (num_tokens, *shape):
            raise RpcError(400, f"KV tensor '{name}' has shape {list(t.shape)}, expected {[num_tokens, *shape]} "
                                f"({num_tokens} prompt tokens)")
        if t.is_floating_point() and t.dtype.itemsize > 1 and not bool(torch.isfinite(t).all()):
            raise RpcError(400, f"KV tensor '{name}' holds non-finite values")
    rng = tensors.get(RNG_STATE_KEY)
    if rng is not None and (rng.dtype != torch.uint8 or rng.dim() != 1):
        raise RpcError(400, f"'{RNG_STATE_KEY}' must be a 1-D uint8 tensor, got {rng.dtype} {list(rng.shape)}")
