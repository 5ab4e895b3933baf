"""Asynchronous successive halving (ASHA), as Ray Tune's ``AsyncHyperBandScheduler``: each
bracket has rungs at ``grace_period · reduction_factor^k`` units of ``time_attr``; a trial
that reaches a rung with a result below the rung's top ``1/reduction_factor`` quantile so far
is stopped, the others go on, and every trial stops at ``max_t``. Nothing waits: a stopped
trial's slot goes to the next trial at once."""

from __future__ import annotations

import math
import random
from typing import Any

from hpckit.errors import ConfigError
from hpckit.sweep.schedulers.base import (
    RankingScheduler,
    Trial,
    TrialScheduler,
    TuneController,
    check_mode,
    check_positive,
    metric_sign,
)


class _Bracket:
    """One bracket's rungs, highest milestone first: ``(milestone, {trial_id: score})``."""

    def __init__(self, min_t: float, max_t: float, reduction_factor: float, s: int,
                 stop_last_trials: bool) -> None:
        self.rf = reduction_factor
        count = int(math.log(max_t / min_t) / math.log(reduction_factor) - s + 1)
        self.rungs: list[tuple[float, dict[str, float]]] = [
            (min_t * reduction_factor ** (k + s), {}) for k in reversed(range(max(count, 0)))]
        self.stop_last_trials = stop_last_trials

    def cutoff(self, recorded: dict[str, float]) -> float | None:
        """The score a trial needs to go on past a rung: the (1 - 1/rf) quantile so far."""
        values = sorted(v for v in recorded.values() if not math.isnan(v))
        if not values:
            return None
        return _percentile(values, (1 - 1 / self.rf) * 100)

    def on_result(self, trial_id: str, now: float, score: float | None) -> str:
        action = TrialScheduler.CONTINUE
        for milestone, recorded in self.rungs:
            if now >= milestone and trial_id in recorded and not self.stop_last_trials:
                break  # decided at this rung already
            if now < milestone or trial_id in recorded:
                continue
            cutoff = self.cutoff(recorded)
            if cutoff is not None and score is not None and score < cutoff:
                action = TrialScheduler.STOP
            recorded[trial_id] = score if score is not None else math.nan
            break
        return action


class AsyncHyperBandScheduler(RankingScheduler):
    """As ``ray.tune.schedulers.AsyncHyperBandScheduler`` (alias ``ASHAScheduler``).

    Args:
        time_attr: the reported attribute that measures progress, increasing
            (``training_iteration``: hpckit counts a trial's reports).
        metric: the metric that ranks trials (default: TuneConfig's).
        mode: "min" or "max" (default: TuneConfig's).
        max_t: a trial stops once ``time_attr`` reaches it.
        grace_period: no trial is stopped before ``time_attr`` reaches it.
        reduction_factor: each rung keeps the top 1/reduction_factor of trials.
        brackets: the number of brackets (each a different first rung).
        stop_last_trials: whether trials stop at ``max_t``.
    """

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None,
                 mode: str | None = None, max_t: float = 100, grace_period: float = 1,
                 reduction_factor: float = 4, brackets: int = 1,
                 stop_last_trials: bool = True) -> None:
        name = type(self).__name__
        check_positive(name, "grace_period", grace_period)
        check_positive(name, "reduction_factor", reduction_factor, minimum=1)
        check_positive(name, "max_t", max_t)
        if not isinstance(brackets, int) or isinstance(brackets, bool) or brackets < 1:
            raise ConfigError(f"{name}(brackets={brackets!r}) must be an integer >= 1.")
        if max_t < grace_period:
            raise ConfigError(f"{name}(max_t={max_t!r}, grace_period={grace_period!r}): max_t "
                              "must be at least the grace period.")
        check_mode(name, mode)
        self._time_attr, self._metric, self._mode = time_attr, metric, mode
        self._max_t, self._stop_last_trials = max_t, stop_last_trials
        self._brackets = [_Bracket(grace_period, max_t, reduction_factor, s, stop_last_trials)
                          for s in range(brackets)]
        self._trial_info: dict[str, int] = {}  # trial_id -> its bracket's index
        self._num_stopped = 0
        self._rng = random.Random()

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        self._require_metric()
        sizes = [len(b.rungs) for b in self._brackets]
        weights = [math.exp(s - max(sizes)) for s in sizes]
        self._trial_info[trial.trial_id] = self._rng.choices(range(len(sizes)), weights)[0]

    def on_trial_result(self, tune_controller: TuneController, trial: Trial,
                        result: dict[str, Any]) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        if result[self._time_attr] >= self._max_t and self._stop_last_trials:
            action = TrialScheduler.STOP
        else:
            bracket = self._brackets[self._trial_info[trial.trial_id]]
            action = bracket.on_result(trial.trial_id, result[self._time_attr],
                                       _score(result, self._metric, self._mode))
        self._num_stopped += action == TrialScheduler.STOP
        return action

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial,
                          result: dict[str, Any]) -> None:
        index = self._trial_info.pop(trial.trial_id, None)
        if index is None or self._time_attr not in result or self._metric not in result:
            return
        self._brackets[index].on_result(trial.trial_id, result[self._time_attr],
                                        _score(result, self._metric, self._mode))

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        self._trial_info.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        lines = [f"Using AsyncHyperBand: num_stopped={self._num_stopped}"]
        for i, bracket in enumerate(self._brackets):
            rungs = ", ".join(f"{m:g}: {len(r)}" for m, r in bracket.rungs)
            lines.append(f"Bracket {i}: rungs {{{rungs}}}")
        return "\n".join(lines)

    def _ends_budget(self, result: dict[str, Any]) -> bool:
        return bool(self._time_attr in result and result[self._time_attr] >= self._max_t)

    def _state(self) -> dict[str, Any]:
        return {"rungs": [[dict(r) for _, r in b.rungs] for b in self._brackets],
                "trial_info": dict(self._trial_info), "num_stopped": self._num_stopped,
                "rng": self._rng.getstate(), "metric": self._metric, "mode": self._mode}

    def _set_state(self, state: dict[str, Any]) -> None:
        for bracket, rungs in zip(self._brackets, state["rungs"], strict=True):
            bracket.rungs = [(m, dict(r)) for (m, _), r in zip(bracket.rungs, rungs, strict=True)]
        self._trial_info = dict(state["trial_info"])
        self._num_stopped = state["num_stopped"]
        self._rng.setstate(state["rng"])
        self._metric = self._metric or state["metric"]
        self._mode = self._mode or state["mode"]


ASHAScheduler = AsyncHyperBandScheduler


def _score(result: dict[str, Any], metric: str, mode: str | None) -> float | None:
    value = result.get(metric)
    if value is None:
        return None
    return metric_sign(mode) * float(value)


def _percentile(values: list[float], percent: float) -> float:
    """The linear-interpolation percentile of sorted ``values`` (numpy's default)."""
    position = (len(values) - 1) * percent / 100
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)
