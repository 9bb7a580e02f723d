"""Benchmarks: every figure is printed beside a peer and the hardware limit measured in the same run."""
