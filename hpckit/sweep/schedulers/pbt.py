"""Population based training, as Ray Tune's ``PopulationBasedTraining``. Every
``perturbation_interval`` of ``time_attr``, a trial in the bottom ``quantile_fraction`` of the
population *exploits* one of the top: it continues from a copy of that donor's newest committed
checkpoint (committed into its own experiment, the donor's left as it was) with the donor's
config *explored* (each mutated value resampled or scaled by a perturbation factor). Both
trials' histories in ``sweep.json`` say so. With ``synch=True`` the population waits at each
interval until every trial reached it.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpckit.errors import ConfigError
from hpckit.logs import log
from hpckit.sweep.domains import Domain, SampleFrom
from hpckit.sweep.schedulers.base import (
    DEFAULT_METRIC,
    RankingScheduler,
    Trial,
    TrialScheduler,
    TuneController,
    check_mode,
    check_positive,
    metric_sign,
)


@dataclass
class _Member:
    """What PBT keeps of one trial."""

    last_score: float | None = None
    last_perturbation_time: float = 0.0
    last_train_time: float = 0.0
    has_checkpoint: bool = False


class PopulationBasedTraining(RankingScheduler):
    """As ``ray.tune.schedulers.PopulationBasedTraining``.

    Args:
        time_attr: the reported attribute that measures progress, increasing.
        metric: the metric that ranks trials (default: TuneConfig's).
        mode: "min" or "max" (default: TuneConfig's).
        perturbation_interval: how much ``time_attr`` between two exploits of a trial; the
            trainable should report a checkpoint at least this often.
        burn_in_period: no exploit before ``time_attr`` reaches it.
        hyperparam_mutations: for each mutated key, a list of values, a search-space
            distribution (``tune.uniform(...)``) or a function that draws one; nested dicts.
        quantile_fraction: the share of the population at the bottom that exploits the same
            share at the top (0 to 0.5).
        resample_probability: the chance a mutated value is drawn anew instead of perturbed.
        perturbation_factors: the factors a numeric value is scaled by.
        custom_explore_fn: a function of the explored config returning the config to use.
        log_config: log each exploit's old and new config.
        require_attrs: refuse results without ``time_attr`` or the metric.
        synch: wait at each interval until the whole population reached it.
    """

    def __init__(self, time_attr: str = "time_total_s", metric: str | None = None,
                 mode: str | None = None, perturbation_interval: float = 60.0,
                 burn_in_period: float = 0.0,
                 hyperparam_mutations: dict[str, Any] | None = None,
                 quantile_fraction: float = 0.25, resample_probability: float = 0.25,
                 perturbation_factors: tuple[float, float] = (1.2, 0.8),
                 custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 log_config: bool = True, require_attrs: bool = True,
                 synch: bool = False) -> None:
        name = type(self).__name__
        mutations = hyperparam_mutations or {}
        if not isinstance(mutations, dict):
            raise ConfigError(f"{name}(hyperparam_mutations={mutations!r}) must be a dict of "
                              "keys to lists, distributions or functions.")
        if not mutations and custom_explore_fn is None:
            raise ConfigError(f"{name} needs hyperparam_mutations or custom_explore_fn: what "
                              "it may change when a trial exploits another.")
        _check_mutations(name, mutations)
        if not isinstance(quantile_fraction, (int, float)) or not 0 <= quantile_fraction <= 0.5:
            raise ConfigError(f"{name}(quantile_fraction={quantile_fraction!r}) must be between "
                              "0 and 0.5.")
        check_positive(name, "perturbation_interval", perturbation_interval)
        check_positive(name, "burn_in_period", burn_in_period, strict=False)
        if not isinstance(resample_probability, (int, float)) or not 0 <= resample_probability <= 1:
            raise ConfigError(f"{name}(resample_probability={resample_probability!r}) must be "
                              "between 0 and 1.")
        check_mode(name, mode)
        self._time_attr, self._metric, self._mode = time_attr, metric, mode
        self._interval = perturbation_interval
        self._burn_in = burn_in_period
        self._mutations = mutations
        self._quantile_fraction = quantile_fraction
        self._resample_probability = resample_probability
        self._factors = tuple(perturbation_factors)
        self._custom_explore_fn = custom_explore_fn
        self._log_config = log_config
        self._require_attrs = require_attrs
        self._synch = synch
        self._members: dict[str, _Member] = {}
        self._next_sync = perturbation_interval
        self._num_perturbations = 0
        self._rng = random.Random()

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        self._require_metric()
        self._members.setdefault(trial.trial_id, _Member())

    def on_trial_result(self, tune_controller: TuneController, trial: Trial,
                        result: dict[str, Any]) -> str:
        metric = self._metric or DEFAULT_METRIC
        if self._time_attr not in result or metric not in result:
            if self._require_attrs:
                raise ConfigError(f"{type(self).__name__} needs {self._time_attr!r} and "
                                  f"{metric!r} in every report; trial {trial.trial_id} reported "
                                  f"{sorted(result)}. Report them, or pass require_attrs=False.")
            return TrialScheduler.CONTINUE
        now = float(result[self._time_attr])
        member = self._members.setdefault(trial.trial_id, _Member())
        if now < self._burn_in or now - member.last_perturbation_time < self._interval:
            return TrialScheduler.CONTINUE
        member.last_score = metric_sign(self._mode) * float(result[metric])
        member.last_train_time = now
        member.has_checkpoint = True  # the report at an interval commits one (see docs)
        if not self._synch:
            member.last_perturbation_time = now
            lower, upper = self._quantiles(tune_controller)
            waiting = any(t.status in ("PENDING", "PAUSED") for t in tune_controller.get_trials()
                          if t.trial_id != trial.trial_id)
            self._checkpoint_or_exploit(tune_controller, trial, upper, lower)
            if trial.status == "PAUSED":
                return TrialScheduler.NOOP
            return TrialScheduler.PAUSE if waiting else TrialScheduler.CONTINUE
        live = [t for t in tune_controller.get_trials() if not t.is_finished()]
        if all(self._members[t.trial_id].last_train_time >= self._next_sync or t is trial
               for t in live if t.trial_id in self._members):
            self._perturb_all(tune_controller, now)
        return TrialScheduler.NOOP if trial.status == "PAUSED" else TrialScheduler.PAUSE

    def _perturb_all(self, tune_controller: TuneController, now: float) -> None:
        """Synchronous mode: the whole population reached the interval; the top first."""
        lower, upper = self._quantiles(tune_controller)
        trials = tune_controller.get_trials()
        middle = [t for t in trials if t.trial_id not in lower + upper]
        by_id = {t.trial_id: t for t in trials}
        for trial in [*(by_id[t] for t in upper), *middle, *(by_id[t] for t in lower)]:
            if trial.trial_id in self._members:
                self._members[trial.trial_id].last_perturbation_time = now
                self._checkpoint_or_exploit(tune_controller, trial, upper, lower)
        times = [m.last_train_time for m in self._members.values()]
        self._next_sync = max(self._next_sync + self._interval, max(times, default=0.0))

    def _checkpoint_or_exploit(self, tune_controller: TuneController, trial: Trial,
                               upper: list[str], lower: list[str]) -> None:
        if trial.trial_id not in lower:
            return
        donor_id = self._rng.choice(upper)
        donor = tune_controller.get_trial(donor_id)
        if donor is None or not self._members[donor_id].has_checkpoint:
            log.info("PBT: trial %s has no checkpoint yet; trial %s does not exploit it",
                     donor_id, trial.trial_id)
            return
        self._exploit(tune_controller, trial, donor)

    def _exploit(self, tune_controller: TuneController, trial: Trial, donor: Trial) -> None:
        config = explore(donor.config, self._mutations, self._resample_probability,
                         self._factors, self._custom_explore_fn, self._rng)
        if self._log_config:
            log.info("PBT: trial %s exploits trial %s (score %s > %s): config %s -> %s",
                     trial.trial_id, donor.trial_id, self._members[donor.trial_id].last_score,
                     self._members[trial.trial_id].last_score, trial.config, config)
        tune_controller._exploit(trial, donor, config)  # noqa: SLF001 (hpckit's own seam)
        self._num_perturbations += 1
        member, source = self._members[trial.trial_id], self._members[donor.trial_id]
        member.last_perturbation_time = source.last_perturbation_time
        member.last_train_time = source.last_train_time

    def _quantiles(self, tune_controller: TuneController) -> tuple[list[str], list[str]]:
        """The trial ids of the bottom and the top quantile, by last score."""
        finished = {t.trial_id for t in tune_controller.get_trials() if t.is_finished()}
        scored = sorted((m.last_score, t) for t, m in self._members.items()
                        if m.last_score is not None and t not in finished)
        if len(scored) <= 1:
            return [], []
        count = int(math.ceil(len(scored) * self._quantile_fraction))
        count = min(count, len(scored) // 2)
        ids = [t for _, t in scored]
        return ids[:count], (ids[-count:] if count else [])

    def choose_trial_to_run(self, tune_controller: TuneController) -> Trial | None:
        candidates = [t for t in tune_controller.get_trials() if t.status in ("PENDING", "PAUSED")
                      and (not self._synch or self._member(t).last_train_time < self._next_sync)]
        candidates.sort(key=lambda t: self._member(t).last_train_time)
        return candidates[0] if candidates else None

    def _member(self, trial: Trial) -> _Member:
        return self._members.setdefault(trial.trial_id, _Member())

    def debug_string(self) -> str:
        return (f"PopulationBasedTraining: {self._num_perturbations} perturbs of "
                f"{len(self._members)} trials")

    def _state(self) -> dict[str, Any]:
        return {"members": copy.deepcopy(self._members), "next_sync": self._next_sync,
                "perturbations": self._num_perturbations, "rng": self._rng.getstate(),
                "metric": self._metric, "mode": self._mode}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._members = dict(state["members"])
        self._next_sync = state["next_sync"]
        self._num_perturbations = state["perturbations"]
        self._rng.setstate(state["rng"])
        self._metric = self._metric or state["metric"]
        self._mode = self._mode or state["mode"]


def explore(config: dict[str, Any], mutations: dict[str, Any], resample_probability: float,
            factors: tuple[float, ...], custom_explore_fn: Callable[..., Any] | None,
            rng: random.Random) -> dict[str, Any]:
    """``config`` with each mutated key resampled (with ``resample_probability``) or perturbed:
    a list's value moves to a neighbour, a number is scaled by one of ``factors``."""
    new = copy.deepcopy(config)
    for key, space in mutations.items():
        current = config.get(key)
        if isinstance(space, dict):
            new[key] = explore(current or {}, space, resample_probability, factors, None, rng)
        elif isinstance(space, (list, tuple)):
            values = list(space)
            if rng.random() < resample_probability or current not in values:
                new[key] = rng.choice(values)
            else:
                step = -1 if rng.random() > 0.5 else 1
                new[key] = values[min(max(values.index(current) + step, 0), len(values) - 1)]
        elif rng.random() < resample_probability or not isinstance(current, (int, float)):
            new[key] = _draw(space, rng)
        else:
            scaled = current * rng.choice(factors)
            new[key] = int(scaled) if isinstance(current, int) else scaled
    if custom_explore_fn is not None:
        new = custom_explore_fn(new)
        if not isinstance(new, dict):
            raise ConfigError(f"PopulationBasedTraining(custom_explore_fn=...) returned {new!r}; "
                              "it must return the config (a dict).")
    return new


def _draw(space: Any, rng: random.Random) -> Any:
    if isinstance(space, SampleFrom):
        return space.func(None)
    if isinstance(space, Domain):
        return space.sample(rng)
    return space()


def _check_mutations(owner: str, mutations: dict[str, Any]) -> None:
    for key, space in mutations.items():
        if isinstance(space, dict):
            _check_mutations(owner, space)
        elif not (isinstance(space, (list, tuple, Domain)) or callable(space)):
            raise ConfigError(f"{owner}(hyperparam_mutations={{{key!r}: {space!r}}}): each value "
                              "must be a list, a tune distribution (tune.uniform(...)) or a "
                              "function that draws one.")
