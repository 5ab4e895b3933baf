"""Ray Tune's trial schedulers on hpckit's sweeps (users import them from
``hpckit.tune.schedulers``): ``FIFOScheduler`` (the default), ``AsyncHyperBandScheduler`` /
``ASHAScheduler``, ``HyperBandScheduler``, ``MedianStoppingRule``, ``PopulationBasedTraining``,
and ``TrialScheduler`` for a scheduler of one's own. Each decides on live results in the
sweep's controller (:mod:`hpckit.sweep.controller`)."""

from hpckit.sweep.schedulers.asha import ASHAScheduler, AsyncHyperBandScheduler
from hpckit.sweep.schedulers.base import FIFOScheduler, TrialScheduler
from hpckit.sweep.schedulers.hyperband import HyperBandScheduler
from hpckit.sweep.schedulers.median import MedianStoppingRule
from hpckit.sweep.schedulers.pbt import PopulationBasedTraining

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler", "FIFOScheduler", "HyperBandScheduler",
           "MedianStoppingRule", "PopulationBasedTraining", "TrialScheduler"]
