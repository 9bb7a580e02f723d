"""``torchinferno.runtime.sampling``: shared sampling (a thin re-export of ``torchinferno.text.sampling``)."""

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.text.sampling import apply_filters, compute_logprobs, make_generator, sample

__all__ = ["sample", "make_generator", "apply_filters", "compute_logprobs", "SamplingParams"]
