"""Ray Tune's API on hpckit: a Ray Tune program runs after ``from ray import tune`` becomes
``from hpckit import tune`` (and ``ray.train`` becomes ``hpckit``).

Inside a trial, ``tune.report`` and ``tune.get_checkpoint`` are hpckit's own ``report`` and
``get_checkpoint`` (``tune.report`` also takes the checkpoint guide's keyword metrics and a
``tune.checkpoint_dir()``): each trial is an ordinary hpckit experiment under the sweep's
directory. The guide's older form is here too: ``tune.run``, ``tune.SyncConfig(upload_dir,
syncer)``, ``tune.Trainable`` and ``ExperimentAnalysis``.
"""

from __future__ import annotations

from hpckit.config import CheckpointConfig, FailureConfig, RunConfig
from hpckit.result import Result
from hpckit.run.session.session import get_checkpoint, get_context
from hpckit.sweep.analysis import ExperimentAnalysis
from hpckit.sweep.config import TuneConfig
from hpckit.sweep.guide import checkpoint_dir, report
from hpckit.sweep.legacy import SyncConfig, run
from hpckit.sweep.results import ResultGrid
from hpckit.sweep.space import choice, grid_search, loguniform, randint, uniform
from hpckit.sweep.trainable import Trainable
from hpckit.sweep.tuner import Tuner

__all__ = [
    "CheckpointConfig",
    "ExperimentAnalysis",
    "FailureConfig",
    "Result",
    "ResultGrid",
    "RunConfig",
    "SyncConfig",
    "Trainable",
    "TuneConfig",
    "Tuner",
    "checkpoint_dir",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "loguniform",
    "randint",
    "report",
    "run",
    "uniform",
]
