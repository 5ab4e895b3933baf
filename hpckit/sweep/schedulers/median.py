"""The median stopping rule, as Ray Tune's ``MedianStoppingRule``: a trial whose best result so
far is worse than the median of the other trials' running means at the same point is
stopped (or paused, without ``hard_stop``)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

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


class MedianStoppingRule(RankingScheduler):
    """As ``ray.tune.schedulers.MedianStoppingRule``.

    Args:
        time_attr: the reported attribute that measures progress, increasing.
        metric: the metric that ranks trials (default: TuneConfig's).
        mode: "min" or "max" (default: TuneConfig's).
        grace_period: no trial is stopped before ``time_attr`` reaches it.
        min_samples_required: how many other trials must have reached the same point.
        min_time_slice: with too few samples, a trial yields its slot to waiting trials at
            most once per this much ``time_attr``.
        hard_stop: stop a trial below the median (else pause it, and let it go on later).
    """

    def __init__(self, time_attr: str = "time_total_s", metric: str | None = None,
                 mode: str | None = None, grace_period: float = 60.0,
                 min_samples_required: int = 3, min_time_slice: float = 0,
                 hard_stop: bool = True) -> None:
        name = type(self).__name__
        check_positive(name, "grace_period", grace_period, strict=False)
        check_positive(name, "min_samples_required", min_samples_required, minimum=1, strict=False)
        check_positive(name, "min_time_slice", min_time_slice, strict=False)
        check_mode(name, mode)
        self._time_attr, self._metric, self._mode = time_attr, metric, mode
        self._grace_period = grace_period
        self._min_samples_required = min_samples_required
        self._min_time_slice = min_time_slice
        self._hard_stop = hard_stop
        self._stopped: set[str] = set()
        self._results: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (time, sign·metric)
        self._last_pause: dict[str, float] = defaultdict(lambda: float("-inf"))

    def on_trial_result(self, tune_controller: TuneController, trial: Trial,
                        result: dict[str, Any]) -> str:
        metric = self._metric or DEFAULT_METRIC
        if self._time_attr not in result or metric not in result:
            return TrialScheduler.CONTINUE
        if trial.trial_id in self._stopped:
            return TrialScheduler.CONTINUE  # paused once already: it runs as under FIFO now
        now = float(result[self._time_attr])
        self._results[trial.trial_id].append((now, metric_sign(self._mode) * float(result[metric])))
        if now < self._grace_period:
            return TrialScheduler.CONTINUE
        others = [t for t in self._beyond(now) if t != trial.trial_id]
        if len(others) < self._min_samples_required:
            return self._insufficient(tune_controller, trial.trial_id, now)
        median = statistics.median(self._running_mean(t, now) for t in others)
        best = max(score for _, score in self._results[trial.trial_id])
        if best < median and now > self._grace_period:
            self._stopped.add(trial.trial_id)
            return TrialScheduler.STOP if self._hard_stop else TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def _insufficient(self, tune_controller: TuneController, trial_id: str, now: float) -> str:
        waiting = any(t.status in ("PENDING", "PAUSED") for t in tune_controller.get_trials())
        if waiting and now - self._last_pause[trial_id] > self._min_time_slice:
            self._last_pause[trial_id] = now
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial,
                          result: dict[str, Any]) -> None:
        metric = self._metric or DEFAULT_METRIC
        if self._time_attr in result and metric in result:
            self._results[trial.trial_id].append(
                (float(result[self._time_attr]), metric_sign(self._mode) * float(result[metric])))

    def _beyond(self, now: float) -> list[str]:
        return [t for t, results in self._results.items() if results and results[-1][0] >= now]

    def _running_mean(self, trial_id: str, now: float) -> float:
        scoped = [s for t, s in self._results[trial_id] if self._grace_period <= t <= now]
        return statistics.fmean(scoped) if scoped else float("-inf")

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={len(self._stopped)}."

    def _state(self) -> dict[str, Any]:
        return {"stopped": set(self._stopped), "results": dict(self._results),
                "last_pause": dict(self._last_pause), "metric": self._metric, "mode": self._mode}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._stopped = set(state["stopped"])
        self._results.update(state["results"])
        self._last_pause.update(state["last_pause"])
        self._metric = self._metric or state["metric"]
        self._mode = self._mode or state["mode"]
