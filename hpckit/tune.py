"""Ray Tune's API on hpckit: a Ray Tune program runs after ``from ray import tune`` becomes
``from hpckit import tune`` (and ``ray.train`` becomes ``hpckit``).

Inside a trial, ``tune.report`` and ``tune.get_checkpoint`` are hpckit's own ``report`` and
``get_checkpoint``: each trial is an ordinary hpckit experiment under the sweep's directory.
"""

from __future__ import annotations

from hpckit.config import CheckpointConfig, FailureConfig, RunConfig
from hpckit.result import Result
from hpckit.run.session import get_checkpoint, get_context, report
from hpckit.sweep.config import TuneConfig
from hpckit.sweep.results import ResultGrid
from hpckit.sweep.space import choice, grid_search, loguniform, randint, uniform
from hpckit.sweep.tuner import Tuner

__all__ = [
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "ResultGrid",
    "RunConfig",
    "TuneConfig",
    "Tuner",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "loguniform",
    "randint",
    "report",
    "uniform",
]
