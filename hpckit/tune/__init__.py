"""Ray Tune's API on hpckit: a Ray Tune program runs after ``from ray import tune`` becomes
``from hpckit import tune`` (and ``ray.train`` becomes ``hpckit``; ``ray.tune.schedulers`` and
``ray.tune.search`` become ``hpckit.tune.schedulers`` and ``hpckit.tune.search``).

Inside a trial, ``tune.report`` and ``tune.get_checkpoint`` are hpckit's own ``report`` and
``get_checkpoint`` (``tune.report`` also takes the checkpoint guide's keyword metrics and a
``tune.checkpoint_dir()``), and ``tune.get_context()`` adds the trial's name, id and
directory: each trial is an ordinary hpckit experiment under the sweep's directory. The
guide's older form is here too: ``tune.run``, ``tune.SyncConfig(upload_dir, syncer)``,
``tune.Trainable`` and ``ExperimentAnalysis``.
"""

from __future__ import annotations

from hpckit.checkpoint import Checkpoint
from hpckit.config import CheckpointConfig, FailureConfig, RunConfig
from hpckit.result import Result
from hpckit.run.session.session import get_checkpoint
from hpckit.sweep.analysis import ExperimentAnalysis
from hpckit.sweep.config import TuneConfig
from hpckit.sweep.context import TuneContext, get_context
from hpckit.sweep.domains import (
    choice,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from hpckit.sweep.guide import checkpoint_dir, report
from hpckit.sweep.legacy import SyncConfig, run
from hpckit.sweep.results import ResultGrid
from hpckit.sweep.space import grid_search
from hpckit.sweep.trainable import Trainable
from hpckit.sweep.tuner import Tuner

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "ExperimentAnalysis",
    "FailureConfig",
    "Result",
    "ResultGrid",
    "RunConfig",
    "SyncConfig",
    "Trainable",
    "TuneConfig",
    "TuneContext",
    "Tuner",
    "checkpoint_dir",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "report",
    "run",
    "sample_from",
    "uniform",
]
