"""Offline workbenches: profile runs, subgraph/region/pattern profiling, candidates and promotion.

Every experiment writes one directory indexed by ``manifest.json`` (``workbench.artifacts``).
Nothing here is imported by models, the engine or the server.
"""
