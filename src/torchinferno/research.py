"""``torchinferno.research``: the documented import path of the research harness (a thin re-export).

The harness lives in ``torchinferno.workbench.research``.
"""

from torchinferno.workbench.research import Experiment, ExperimentResult, ResearchHarness, smoke_harness

__all__ = ["ResearchHarness", "ExperimentResult", "Experiment", "smoke_harness"]
