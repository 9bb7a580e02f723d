"""Control messages of a prefill/decode pair, relayed by the API process (``disagg.client``) over the cores' ZeroMQ
sockets (msgspec, like ``engine.core_types``). The KV itself never travels here (``disagg.transport``).

Handoff of request R: API -> prefill ``KVPrefill(R with max_tokens=1)``; prefill -> API its first token (an
ordinary output, held KV); API -> decode ``KVDecode(R, first token, transfer id)``; decode, once it has blocks
(it may wait: back-pressure) -> API ``KVReady(rows)``; API -> prefill ``KVSend(rows)``; both transfer threads move
the rows; prefill -> API ``KVSent`` (its blocks are released: cached for prefix reuse) and decode -> API
``KVReceived`` (R runs there from now on, its outputs come from the decode core). ``KVRelease`` drops held KV
nobody will ask for; ``KVDropped``: decode dropped R before reserving (abort), so its held KV can be released.
"""

from __future__ import annotations

import msgspec

from torchinferno.engine.core_types import EngineCoreRequest

__all__ = [
    "FROM_DECODE",
    "FROM_PREFILL",
    "TO_DECODE",
    "TO_PREFILL",
    "KVDecode",
    "KVDropped",
    "KVPrefill",
    "KVReady",
    "KVReceived",
    "KVRelease",
    "KVSend",
    "KVSent",
]


class KVPrefill(msgspec.Struct, array_like=True, tag="kvpre"):
    request: EngineCoreRequest  # max_tokens already 1: the prefill role samples the first token only


class KVSend(msgspec.Struct, array_like=True, tag="kvsend"):
    request_id: str
    transfer_id: int
    start: int
    stop: int


class KVRelease(msgspec.Struct, array_like=True, tag="kvrel"):
    request_ids: list[str]


class KVDecode(msgspec.Struct, array_like=True, tag="kvdec"):
    request: EngineCoreRequest  # the client's parameters
    first_token: int
    transfer_id: int


class KVReady(msgspec.Struct, array_like=True, tag="kvready"):
    request_id: str
    transfer_id: int
    start: int
    stop: int


class KVDropped(msgspec.Struct, array_like=True, tag="kvdrop"):
    request_id: str


class KVSent(msgspec.Struct, array_like=True, tag="kvsent"):
    request_id: str
    ok: bool
    nbytes: int = 0
    pack_s: float = 0.0
    wire_s: float = 0.0
    error: str | None = None


class KVReceived(msgspec.Struct, array_like=True, tag="kvrecv"):
    request_id: str
    ok: bool
    nbytes: int = 0
    unpack_s: float = 0.0
    wire_s: float = 0.0
    error: str | None = None
    num_tokens: int = 0  # rows received (prompt length minus the decode side's prefix hit)
    num_cached_tokens: int = 0  # prefix hit on the decode side
    waited_for_blocks: bool = False  # the decode pool was full when it arrived: it queued (back-pressure)


TO_PREFILL = (KVPrefill, KVSend, KVRelease)
TO_DECODE = (KVDecode,)
FROM_PREFILL = (KVSent,)
FROM_DECODE = (KVReady, KVDropped, KVReceived)
