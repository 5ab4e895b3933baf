"""Searchers that wrap another, as Ray Tune's: ``ConcurrencyLimiter`` (at most N of its
trials live at once, or in batches of N) and ``Repeater`` (each suggestion run N times, the
searcher told their mean)."""

from __future__ import annotations

import copy
import math
import statistics
from typing import Any

from hpckit.config.values import is_int
from hpckit.errors import ConfigError
from hpckit.sweep.search.searcher import (
    FINISHED,
    Searcher,
    dump,
    load,
    restore_bytes,
    saved_bytes,
)

TRIAL_INDEX = "__trial_index__"


class ConcurrencyLimiter(Searcher):
    """As ``ray.tune.search.ConcurrencyLimiter``.

    Args:
        searcher: the searcher whose suggestions are limited.
        max_concurrent: the most of its trials live at once.
        batch: wait for all ``max_concurrent`` trials to end before suggesting more.
    """

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(searcher, Searcher):
            raise ConfigError(f"ConcurrencyLimiter({searcher!r}, ...) wraps a Searcher (e.g. "
                              "OptunaSearch()).")
        if not is_int(max_concurrent) or max_concurrent < 1:
            raise ConfigError(f"ConcurrencyLimiter(max_concurrent={max_concurrent!r}) must be an "
                              "integer >= 1.")
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self.batch = batch
        self.live_trials: set[str] = set()
        self.cached_results: dict[str, tuple[dict[str, Any] | None, bool]] = {}
        self._limit = True
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    @property
    def metric(self) -> Any:
        return self.searcher.metric

    @property
    def mode(self) -> Any:
        return self.searcher.mode

    def set_search_properties(self, metric: str | None, mode: str | None,
                              config: dict[str, Any], **spec: Any) -> bool:
        self._limit = not self.searcher.set_max_concurrency(self.max_concurrent)
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if not self._limit:
            return self.searcher.suggest(trial_id)
        if len(self.live_trials) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if suggestion not in (None, FINISHED):
            self.live_trials.add(trial_id)
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        if trial_id not in self.live_trials:
            if not self._limit:
                self.searcher.on_trial_complete(trial_id, result=result, error=error)
            return
        if not self.batch:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            self.live_trials.discard(trial_id)
            return
        self.cached_results[trial_id] = (result, error)
        if len(self.cached_results) == self.max_concurrent:
            for cached, (value, failed) in self.cached_results.items():
                self.searcher.on_trial_complete(cached, result=value, error=failed)
                self.live_trials.discard(cached)
            self.cached_results = {}

    def add_evaluated_point(self, parameters: dict[str, Any], value: float, error: bool = False,
                            pruned: bool = False,
                            intermediate_values: list[float] | None = None) -> None:
        self.searcher.add_evaluated_point(parameters, value, error, pruned, intermediate_values)

    def get_state(self) -> dict[str, Any]:
        return {"live_trials": set(self.live_trials), "cached_results": dict(self.cached_results),
                "limit": self._limit}

    def set_state(self, state: dict[str, Any]) -> None:
        self.live_trials = set(state["live_trials"])
        self.cached_results = dict(state["cached_results"])
        self._limit = state["limit"]

    def save(self, checkpoint_path: str) -> None:
        dump(checkpoint_path, {"own": self.get_state(), "searcher": saved_bytes(self.searcher)})

    def restore(self, checkpoint_path: str) -> None:
        state = load(checkpoint_path)
        self.set_state(state["own"])
        if state["searcher"] is not None:
            restore_bytes(self.searcher, state["searcher"])


class _Group:
    """The trials that run one suggestion: the first one's id is the searcher's."""

    def __init__(self, primary: str, config: dict[str, Any], size: int) -> None:
        self.primary, self.config, self.size = primary, config, size
        self.members = [primary]
        self.scores: dict[str, float] = {}

    def full(self) -> bool:
        return len(self.members) >= self.size


class Repeater(Searcher):
    """As ``ray.tune.search.Repeater``.

    Args:
        searcher: the searcher whose suggestions are repeated.
        repeat: how many trials run each suggestion.
        set_index: put each repetition's number in its config as ``__trial_index__``.
    """

    def __init__(self, searcher: Searcher, repeat: int = 1, set_index: bool = True) -> None:
        if not isinstance(searcher, Searcher):
            raise ConfigError(f"Repeater({searcher!r}, ...) wraps a Searcher.")
        if not is_int(repeat) or repeat < 1:
            raise ConfigError(f"Repeater(repeat={repeat!r}) must be an integer >= 1.")
        self.searcher = searcher
        self.repeat = repeat
        self._set_index = set_index
        self._groups: list[_Group] = []
        self._of: dict[str, _Group] = {}
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    @property
    def metric(self) -> Any:
        return self.searcher.metric

    @property
    def mode(self) -> Any:
        return self.searcher.mode

    def set_search_properties(self, metric: str | None, mode: str | None,
                              config: dict[str, Any], **spec: Any) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        current = self._groups[-1] if self._groups else None
        if current is None or current.full():
            suggestion = self.searcher.suggest(trial_id)
            if not isinstance(suggestion, dict):
                return suggestion
            current = _Group(trial_id, copy.deepcopy(suggestion), self.repeat)
            self._groups.append(current)
        else:
            current.members.append(trial_id)
        self._of[trial_id] = current
        config = copy.deepcopy(current.config)
        if self._set_index:
            config[TRIAL_INDEX] = current.members.index(trial_id)
        return config

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        pass  # the searcher hears of a suggestion once, with the mean of its repetitions

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        group = self._of.get(trial_id)
        if group is None:
            return
        metric = self.searcher.metric
        value = (result or {}).get(metric) if isinstance(metric, str) else None
        group.scores[trial_id] = float(value) if value is not None else math.nan
        if len(group.scores) == group.size:
            scores = [s for s in group.scores.values() if not math.isnan(s)]
            mean = statistics.fmean(scores) if scores else math.nan
            self.searcher.on_trial_complete(group.primary, result={metric: mean}, error=error)

    def get_state(self) -> dict[str, Any]:
        return {"groups": [(g.primary, g.config, g.size, g.members, g.scores) for g in self._groups]}

    def set_state(self, state: dict[str, Any]) -> None:
        self._groups, self._of = [], {}
        for primary, config, size, members, scores in state["groups"]:
            group = _Group(primary, config, size)
            group.members, group.scores = list(members), dict(scores)
            self._groups.append(group)
            self._of.update(dict.fromkeys(group.members, group))

    def save(self, checkpoint_path: str) -> None:
        dump(checkpoint_path, {"own": self.get_state(), "searcher": saved_bytes(self.searcher)})

    def restore(self, checkpoint_path: str) -> None:
        state = load(checkpoint_path)
        self.set_state(state["own"])
        if state["searcher"] is not None:
            restore_bytes(self.searcher, state["searcher"])
