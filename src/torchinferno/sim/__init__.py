"""Serving simulator: the real ``EngineCore`` + ``Scheduler`` + ``BlockPool`` on a virtual clock.

``traffic`` (arrivals, lengths, trace replay), ``cost_model`` (fitted per-step cost), ``calibration`` /
``calibrate`` (calibration files, probes on the real model), ``executor`` (``SimulatedExecutor``), ``driver``
(event loop + metrics), ``routing`` / ``cluster`` (replicas, TP, P/D), ``plan`` (configuration search),
``validate`` (simulator vs the real engine). See docs/SIMULATION.md. No import-time side effects.
"""
