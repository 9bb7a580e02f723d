"""``torchinferno.runtime.disaggregated``: prefill/decode role topology, the ordered control protocol and the live KV
handoff used by ``serve --disaggregation-mode prefill-decode`` (``disagg/``); thin re-exports."""

from torchinferno.disagg.client import DisaggConfig, DisaggLLM
from torchinferno.disagg.kv_io import live_kv_bytes, pack_kv, unpack_kv
from torchinferno.disagg.roles import DecodeRole, PrefillRole, RoleConfig
from torchinferno.disagg.transport import KVTransport, TransportConfig, pick_backend

__all__ = ["DecodeRole", "DisaggConfig", "DisaggLLM", "KVTransport", "PrefillRole", "RoleConfig", "TransportConfig",
           "live_kv_bytes", "pack_kv", "pick_backend", "unpack_kv"]
