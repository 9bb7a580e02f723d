"""Prefill/decode disaggregation: a prefill engine core and a decode engine core in separate processes, with
the prompt's live KV handed from one to the other over a dedicated two-rank ``torch.distributed`` group.

``kv_io`` (pack/unpack of live KV rows), ``transport`` (the two-rank group and its transfer thread), ``sharding``
(a TP rank's part of the KV), ``messages`` (the control messages between the API process and the cores),
``accounting`` (transfer totals, /metrics collectors, the integrity record), ``roles`` (each core's side of the
handoff, driven from the engine-core process loop), ``topology`` / ``launch`` (each role's devices and transports,
starting the two cores), ``client`` (``DisaggLLM``: the API side, ``AsyncLLM``'s interface over the two cores).
``runtime.disaggregated`` re-exports the public names under the original's path.
"""
