"""What TuneConfig asks of a sweep beyond the planned grid: its scheduler, its search algorithm
(trials made one at a time from ``suggest``, up to ``num_samples``), its time budget; and where
that cannot run (a Slurm job array, whose tasks share no live results), the refusal.

``TuneConfig`` checks the values; this module turns them into the :class:`Search` the
controller (:mod:`.controller`) consults, or None for a sweep that is only its plan.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from hpckit.errors import ConfigError
from hpckit.logs import log
from hpckit.sweep import record as rec
from hpckit.sweep import space
from hpckit.sweep.schedulers.base import FIFOScheduler, TrialScheduler
from hpckit.sweep.search.searcher import FINISHED, Searcher, restore_bytes, saved_bytes
from hpckit.sweep.search.variants import BasicVariantGenerator

Namer = Callable[[int, dict[str, Any], list[tuple[str, ...]]], str]


class Search:
    """The scheduler, the search algorithm (None: the planned grid) and the time budget of
    one sweep, with Ray's calls on them."""

    def __init__(self, scheduler: TrialScheduler, searcher: Searcher | None,
                 param_space: dict[str, Any], num_samples: int, time_budget_s: float | None,
                 namer: Namer) -> None:
        self.scheduler = scheduler
        self.searcher = searcher
        self.param_space = param_space
        self.num_samples = num_samples
        self.time_budget_s = time_budget_s
        self.namer = namer
        self.count = 0  # trials suggested so far
        self.finished = searcher is None
        self._warned = False

    @property
    def dynamic(self) -> bool:
        return self.searcher is not None

    def suggest(self, index: int, running: set[int]) -> tuple[rec.Trial, dict[str, Any]] | None:
        """A new trial numbered ``index`` with the searcher's config, or None (none now, or
        none ever again: then :attr:`finished`)."""
        if self.searcher is None or self.finished:
            return None
        if self.num_samples != -1 and self.count >= self.num_samples:
            self.finished = True
            return None
        trial_id = f"{index:05d}"
        suggestion = self.searcher.suggest(trial_id)
        if suggestion == FINISHED:
            self.finished = True
            return None
        if suggestion is None:
            if not running and not self._warned:
                self._warned = True
                log.warning("the search algorithm suggests no trial while none runs; the sweep "
                            "ends here (a rerun asks it again)")
                self.finished = True
            return None
        if not isinstance(suggestion, dict):
            raise ConfigError(f"{type(self.searcher).__name__}.suggest() returned "
                              f"{suggestion!r}: a config dict, None or Searcher.FINISHED.")
        self.count += 1
        params = space.merged(space.constants(self.param_space), suggestion)
        paths = space.varied(self.param_space) or _leaf_paths(suggestion)
        record = rec.Trial(index, self.namer(index, params, paths), _json(params))
        return record, params

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if self.searcher is not None:
            self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None, error: bool) -> None:
        if self.searcher is not None:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def saved(self) -> bytes | None:
        if self.searcher is None:
            return None
        data = saved_bytes(self.searcher)
        if data is None and not self._warned:
            self._warned = True
            log.warning("%s has no save(): a rerun of the sweep starts it afresh (its trials "
                        "are kept)", type(self.searcher).__name__)
        return data

    def restore(self, data: bytes | None, count: int, finished: bool) -> None:
        self.count, self.finished = count, finished or self.searcher is None
        if data is not None and self.searcher is not None:
            restore_bytes(self.searcher, data)


def search_for(tune_config: Any, param_space: dict[str, Any] | None, namer: Namer,
               array: bool) -> Search | None:
    """The sweep's :class:`Search`, or None where it is only its plan (FIFO over the grid and
    the draws, no time budget). Refused on a Slurm job array, naming the allocation forms."""
    scheduler = tune_config.scheduler
    searcher = tune_config.search_alg
    budget = tune_config.time_budget_s
    if isinstance(budget, datetime.timedelta):
        budget = budget.total_seconds()
    plain = scheduler is None or type(scheduler) is FIFOScheduler
    planned = searcher is None or isinstance(searcher, BasicVariantGenerator)
    if plain and planned and budget is None:
        return None
    if array:
        what = ("TuneConfig(time_budget_s=...)" if plain and planned else
                f"{type(scheduler if not plain else searcher).__name__}")
        raise ConfigError(
            f"{what} decides on live results of every trial, which a Slurm job array's tasks "
            "do not share: run the sweep in one allocation instead (python sweep.py in an "
            "sbatch script of several nodes, or srun/mpirun python sweep.py).")
    space_ = param_space or {}
    scheduler = scheduler or FIFOScheduler()
    metric, mode = tune_config.metric, tune_config.mode
    scheduler.set_search_properties(metric, mode)
    if not planned:
        _connect(searcher, metric, mode, space_)
    return Search(scheduler, None if planned else searcher, space_, tune_config.num_samples,
                  budget, namer)


def _connect(searcher: Searcher, metric: str | None, mode: str | None,
             param_space: dict[str, Any]) -> None:
    if not searcher.set_search_properties(metric, mode, param_space):
        if any(isinstance(v, (space.Grid, space.Domain)) for _, v in space.leaves(param_space)):
            raise ConfigError(
                f"{type(searcher).__name__} has a search space of its own, and param_space has "
                "distributions too: give the space to one of them.")
    if searcher.metric is None or searcher.mode is None:
        raise ConfigError(f"{type(searcher).__name__} needs a metric and a mode: pass them to it "
                          "or to TuneConfig(metric=..., mode=...).")


def _leaf_paths(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for key, value in values.items():
        if isinstance(value, dict):
            paths.extend(_leaf_paths(value, (*prefix, str(key))))
        else:
            paths.append((*prefix, str(key)))
    return paths


def _json(params: dict[str, Any]) -> dict[str, Any]:
    from hpckit.experiment.values import jsonable

    converted: dict[str, Any] = jsonable(params)
    return converted
