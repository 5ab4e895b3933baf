"""TuneConfig: how many trials, ranked by which metric, how many at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hpckit.config.values import is_int
from hpckit.errors import ConfigError


@dataclass(frozen=True)
class TuneConfig:
    """As ``ray.tune.TuneConfig``, with ``seed`` for the search space's draws (Ray seeds
    them through a search algorithm; hpckit has one, the grid-and-random variant generator)."""

    metric: str | None = None
    """The reported metric that ranks trials (``ResultGrid.get_best_result()``)."""

    mode: Literal["max", "min"] | None = None
    """Whether a higher (``"max"``) or lower (``"min"``) ``metric`` is better."""

    num_samples: int = 1
    """How many times the whole grid is repeated, with fresh draws for the distributions."""

    max_concurrent_trials: int | None = None
    """Trials running at once under mpirun/srun, at most; None: as many as the ranks allow
    (under ``python sweep.py`` trials run one at a time)."""

    seed: int | None = None
    """Seed for the draws; None draws one and records it, so a rerun makes the same trials."""

    trial_dirname_creator: Callable[[Any], str] | None = None
    """A function of the trial (with ``trial_id``, ``index`` and ``config``) naming its
    directory; None: ``trial_00000_lr=0.01,batch_size=32``."""

    def __post_init__(self) -> None:
        if self.metric is not None and (not isinstance(self.metric, str) or not self.metric):
            raise ConfigError(f"TuneConfig(metric={self.metric!r}) must be the name of a "
                              "reported metric, e.g. metric='accuracy', or None.")
        if self.mode not in (None, "max", "min"):
            raise ConfigError(f"TuneConfig(mode={self.mode!r}) is invalid: use 'max' (higher "
                              "is better) or 'min' (lower is better).")
        if (self.metric is None) != (self.mode is None):
            raise ConfigError("TuneConfig needs metric and mode together (e.g. metric='loss', "
                              f"mode='min'), or neither; got metric={self.metric!r}, "
                              f"mode={self.mode!r}.")
        if not is_int(self.num_samples) or self.num_samples < 1:
            raise ConfigError(f"TuneConfig(num_samples={self.num_samples!r}) must be an integer "
                              ">= 1: how often the grid is repeated with fresh draws.")
        concurrent = self.max_concurrent_trials
        if concurrent is not None and (not is_int(concurrent) or concurrent < 1):
            raise ConfigError(f"TuneConfig(max_concurrent_trials={concurrent!r}) must be an "
                              "integer >= 1, or None for as many as the ranks allow.")
        if self.seed is not None and not is_int(self.seed):
            raise ConfigError(f"TuneConfig(seed={self.seed!r}) must be an integer or None.")
        creator = self.trial_dirname_creator
        if creator is not None and not callable(creator):
            raise ConfigError(f"TuneConfig(trial_dirname_creator={creator!r}) must be a "
                              "function of the trial returning a directory name.")
