"""``torchinferno.runtime.offload``: host-memory weights staged to the device per decoder layer, movement vs
compute accounting (thin re-exports of ``workbench.offload``)."""

from torchinferno.workbench.offload import LayerOffloader, OffloadEvent, profile_offload

__all__ = ["LayerOffloader", "OffloadEvent", "profile_offload"]
