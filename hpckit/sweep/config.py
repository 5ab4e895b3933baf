"""TuneConfig: how many trials, ranked by which metric, how many at a time, chosen and
scheduled by what."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hpckit.config.values import is_int
from hpckit.errors import ConfigError
from hpckit.sweep.schedulers.base import TrialScheduler
from hpckit.sweep.search.searcher import Searcher
from hpckit.sweep.search.variants import BasicVariantGenerator


@dataclass(frozen=True)
class TuneConfig:
    """As ``ray.tune.TuneConfig``, with ``seed`` for the search space's draws (Ray seeds
    them through its search algorithm's ``random_state``; hpckit takes either).

    Args:
        metric: The reported metric that ranks trials (``ResultGrid.get_best_result()``);
            None (the default): none. Given with ``mode``, or neither.
        mode: Whether a higher (``"max"``) or lower (``"min"``) ``metric`` is better; None
            (the default) with no ``metric``.
        search_alg: The search algorithm that suggests each trial's config
            (``hpckit.tune.search``: a ``Searcher`` or a ``BasicVariantGenerator``); None
            (the default): the grid and random draws of ``param_space``.
        scheduler: The trial scheduler that stops, pauses or exploits trials on their
            results (``hpckit.tune.schedulers``); None (the default): FIFO, every trial to
            its end.
        num_samples: How many times the whole grid is repeated, with fresh draws for the
            distributions; with a search algorithm, how many trials it suggests. An integer
            >= 1 (default 1), or -1 with a search algorithm or a time budget: until it says
            it is finished, or the time budget is spent.
        max_concurrent_trials: Trials running at once under mpirun/srun, at most (an integer
            >= 1); None (the default): as many as the ranks allow (under
            ``python sweep.py`` trials run one at a time).
        seed: An integer seed for the draws; None (the default) draws one and records it,
            so a rerun makes the same trials. hpckit's own.
        trial_dirname_creator: A function of the trial (with ``trial_id``, ``index`` and
            ``config``) naming its directory; None (the default):
            ``trial_00000_lr=0.01,batch_size=32``.
        trial_name_creator: A function of the trial naming it
            (``tune.get_context().get_trial_name()``); None (the default): its directory's
            name.
        time_budget_s: Seconds (> 0, or a ``datetime.timedelta``) the sweep may run: after
            them, running trials stop at their next report and none starts (a rerun
            continues the pending ones, with a budget of its own). None (the default): no
            limit.
        reuse_actors: Ray's reuse of a trial's process for the next trial: hpckit runs every
            trial as its own run, so it has no effect (True is said once, in a warning).

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    metric: str | None = None
    mode: Literal["max", "min"] | None = None
    search_alg: Searcher | BasicVariantGenerator | None = None
    scheduler: TrialScheduler | None = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    seed: int | None = None
    trial_dirname_creator: Callable[[Any], str] | None = None
    trial_name_creator: Callable[[Any], str] | None = None
    time_budget_s: float | datetime.timedelta | None = None
    reuse_actors: bool | None = None

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
        searching = isinstance(self.search_alg, Searcher) or self.time_budget_s is not None
        if not is_int(self.num_samples) or (self.num_samples < 1 and not (
                self.num_samples == -1 and searching)):
            raise ConfigError(f"TuneConfig(num_samples={self.num_samples!r}) must be an integer "
                              ">= 1: how often the grid is repeated with fresh draws (-1, no "
                              "limit, with a search algorithm or a time budget).")
        if self.search_alg is not None and not isinstance(self.search_alg,
                                                          (Searcher, BasicVariantGenerator)):
            raise ConfigError(f"TuneConfig(search_alg={self.search_alg!r}) must be a Searcher "
                              "(hpckit.tune.search: OptunaSearch, ConcurrencyLimiter, ... or your "
                              "own subclass) or a BasicVariantGenerator.")
        if self.scheduler is not None and not isinstance(self.scheduler, TrialScheduler):
            raise ConfigError(f"TuneConfig(scheduler={self.scheduler!r}) must be a TrialScheduler "
                              "(hpckit.tune.schedulers: ASHAScheduler, HyperBandScheduler, "
                              "PopulationBasedTraining, ... or your own subclass).")
        budget = self.time_budget_s
        seconds = budget.total_seconds() if isinstance(budget, datetime.timedelta) else budget
        if budget is not None and (not isinstance(seconds, (int, float)) or isinstance(
                seconds, bool) or seconds <= 0):
            raise ConfigError(f"TuneConfig(time_budget_s={budget!r}) must be seconds > 0 (or a "
                              "datetime.timedelta), or None for no limit.")
        if self.reuse_actors not in (None, True, False):
            raise ConfigError(f"TuneConfig(reuse_actors={self.reuse_actors!r}) must be True, "
                              "False or None.")
        concurrent = self.max_concurrent_trials
        if concurrent is not None and (not is_int(concurrent) or concurrent < 1):
            raise ConfigError(f"TuneConfig(max_concurrent_trials={concurrent!r}) must be an "
                              "integer >= 1, or None for as many as the ranks allow.")
        if self.seed is not None and not is_int(self.seed):
            raise ConfigError(f"TuneConfig(seed={self.seed!r}) must be an integer or None.")
        for name in ("trial_dirname_creator", "trial_name_creator"):
            creator = getattr(self, name)
            if creator is not None and not callable(creator):
                raise ConfigError(f"TuneConfig({name}={creator!r}) must be a function of the "
                                  "trial returning a name.")
