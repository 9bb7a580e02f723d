"""``torchinferno.runtime.disagg``: agent-editable rank files and their local RPC wrappers, for executable
prefill/decode experiments (``disagg-init`` writes the files, ``disagg-smoke`` drives them).

The pieces live next to this module: ``disagg_rank`` (one rank: model, paged KV cache, prefill/decode/release),
``disagg_wire`` (JSON control + safetensors tensor payloads, one-line 4xx refusals), ``disagg_http`` (stdlib HTTP
server, client, the prefill -> decode driver) and ``disagg_files`` (the rank-file writer). The server's own
prefill/decode mode is ``runtime.disaggregated``.
"""

from torchinferno.runtime.disagg_files import (
    RankFilesSpec,
    default_model_source,
    rank_file_name,
    write_rank_files,
)
from torchinferno.runtime.disagg_http import (
    DisaggError,
    DisaggResult,
    RankClient,
    RankRefused,
    RankUnreachable,
    make_server,
    run_disagg_request,
    serve_rank,
)
from torchinferno.runtime.disagg_rank import DisaggRank, RankConfig
from torchinferno.runtime.disagg_wire import (
    RpcError,
    check_kv_payload,
    decode_message,
    encode_message,
)

__all__ = [
    "DisaggError",
    "DisaggRank",
    "DisaggResult",
    "RankClient",
    "RankConfig",
    "RankFilesSpec",
    "RankRefused",
    "RankUnreachable",
    "RpcError",
    "check_kv_payload",
    "decode_message",
    "default_model_source",
    "encode_message",
    "make_server",
    "rank_file_name",
    "run_disagg_request",
    "serve_rank",
    "write_rank_files",
]
