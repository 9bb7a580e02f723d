"""Plain data shared by every path: sampling parameters, requests, step outputs."""

from torchinferno.core.sampling_params import SamplingParams

__all__ = ["SamplingParams"]
