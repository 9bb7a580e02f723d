"""The E4M3 scaling rule every FP8 path of this package shares (per-token / per-channel rows of ``fp8_linear``,
1x128 / 128x128 groups of ``fp8_block``, their Triton kernels, NVFP4's block scales).

A group's scale is ``max(amax, EPS) * INV_E4M3_MAX``: its largest magnitude maps to E4M3's largest finite value,
an all-zero group gets a finite scale and quantizes to zeros, and the scale is a product with one fp32 constant
(not a division), so it rounds the same on every device and in every kernel.
"""

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
INV_E4M3_MAX = 1.0 / E4M3_MAX
EPS = 1e-12  # floor of a group's amax

__all__ = ["E4M3_MAX", "EPS", "INV_E4M3_MAX"]
