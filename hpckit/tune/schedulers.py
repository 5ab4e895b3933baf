"""Ray Tune's trial schedulers, as ``ray.tune.schedulers`` names them (the code:
:mod:`hpckit.sweep.schedulers`)."""

from __future__ import annotations

from hpckit.sweep.schedulers import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    TrialScheduler,
)

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler", "FIFOScheduler", "HyperBandScheduler",
           "MedianStoppingRule", "PopulationBasedTraining", "TrialScheduler"]
