"""Synchronous HyperBand, as Ray Tune's ``HyperBandScheduler``: trials fill brackets of bands;
in a bracket every trial runs to the bracket's rung and is paused there (its checkpoint of
that report committed, its slot freed), and once all of the bracket's trials reached the
rung the best ``1/reduction_factor`` of them continue, each from its own checkpoint, and the
others are stopped. The first bracket of a band runs its trials to ``max_t`` with no rung;
later ones start with more trials and shorter rungs.
"""

from __future__ import annotations

import math
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

PAUSED, PENDING, RUNNING = "PAUSED", "PENDING", "RUNNING"


class _Bracket:
    """Trials that are halved together: ``live`` maps each trial id to its last result."""

    def __init__(self, time_attr: str, max_trials: int, init_t: int, max_t: int, eta: float,
                 s: int, stop_last_trials: bool) -> None:
        self.time_attr = time_attr
        self.live: dict[str, dict[str, Any] | None] = {}
        self.all: list[str] = []
        self.n = self.n0 = max_trials
        self.r = self.r0 = init_t
        self.max_t = max_t
        self.cumul_r = self.r0
        self.eta = eta
        self.halves = s
        self.total_work = self._work(max_trials, init_t, s)
        self.completed = 0.0
        self.stop_last_trials = stop_last_trials
        self.processing = False
        self.to_unpause: set[str] = set()

    def add(self, trial_id: str) -> None:
        self.live[trial_id] = None
        self.all.append(trial_id)

    def filled(self) -> bool:
        return len(self.live) == self.n

    def time_of(self, result: dict[str, Any] | None) -> float:
        return 0 if result is None else float(result[self.time_attr])

    def rung_done(self) -> bool:
        """Every live trial has reached the current rung."""
        return all(self.time_of(r) >= self.cumul_r for r in self.live.values())

    def finished(self) -> bool:
        return self.stop_last_trials and self.halves == 0 and self.rung_done()

    def goes_on(self, trial_id: str) -> bool:
        """Whether the trial is still below the current rung (or the last one runs on)."""
        if not self.stop_last_trials and self.halves == 0:
            return True
        return self.time_of(self.live[trial_id]) < self.cumul_r

    def halve(self, metric: str, sign: float) -> tuple[list[str], list[str]]:
        """The trials that go on and those stopped, at the end of a rung."""
        if self.halves == 0 and not self.stop_last_trials:
            return list(self.live), []
        self.halves -= 1
        self.n = int(math.ceil(self.n / self.eta))
        self.r = int(min(self.r * self.eta, self.max_t))
        self.cumul_r = self.r
        ranked = sorted(self.live, key=lambda t: sign * float((self.live[t] or {})[metric]))
        return ranked[-self.n:], ranked[:-self.n]

    def update(self, trial_id: str, result: dict[str, Any]) -> None:
        self.completed += max(0.0, self.time_of(result) - self.time_of(self.live[trial_id]))
        self.live[trial_id] = result
        self.to_unpause.discard(trial_id)

    def cleanup(self, trial_id: str) -> None:
        self.live.pop(trial_id, None)

    def completion(self) -> float:
        return self.completed / self.total_work if self.total_work else 0.0

    def _work(self, n: float, r: float, s: int) -> int:
        work, cumulative = 0, r
        for _ in range(s + 1):
            work += int(n) * int(r)
            n = int(math.ceil(n / self.eta))
            r = int(min(r * self.eta, self.max_t - cumulative))
            cumulative += r
        return work


class HyperBandScheduler(RankingScheduler):
    """As ``ray.tune.schedulers.HyperBandScheduler`` (synchronous HyperBand).

    Args:
        time_attr: the reported attribute that measures progress, increasing.
        metric: the metric that ranks trials (default: TuneConfig's).
        mode: "min" or "max" (default: TuneConfig's).
        max_t: the most ``time_attr`` a trial runs; with ``reduction_factor`` it sets the
            brackets (as in Ray, max_t=81 and reduction_factor=3 give five).
        reduction_factor: each rung keeps the top 1/reduction_factor of a bracket's trials.
        stop_last_trials: whether trials stop at ``max_t``.
    """

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None,
                 mode: str | None = None, max_t: int = 81, reduction_factor: float = 3,
                 stop_last_trials: bool = True) -> None:
        name = type(self).__name__
        check_positive(name, "max_t", max_t)
        check_positive(name, "reduction_factor", reduction_factor, minimum=1)
        check_mode(name, mode)
        self._time_attr, self._metric, self._mode = time_attr, metric, mode
        self._eta = reduction_factor
        self._s_max_1 = int(round(math.log(max_t) / math.log(reduction_factor))) + 1
        self._max_t = max_t
        self._stop_last_trials = stop_last_trials
        self._bands: list[list[_Bracket]] = [[]]
        self._trial_info: dict[str, tuple[int, int]] = {}  # trial_id -> (band, bracket)
        self._current: tuple[int, int] | None = None
        self._num_stopped = 0

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        self._require_metric()
        if self._current is None or self._bracket(self._current).filled():
            self._current = self._new_bracket()
        self._bracket(self._current).add(trial.trial_id)
        self._trial_info[trial.trial_id] = self._current

    def _new_bracket(self) -> tuple[int, int]:
        while True:
            if len(self._bands[-1]) == self._s_max_1:
                self._bands.append([])
            band = self._bands[-1]
            s = len(band)
            r0 = int(self._max_t * self._eta ** (-s))
            band.append(_Bracket(self._time_attr, int(math.ceil(self._s_max_1 / (s + 1) * self._eta ** s)),
                                 r0, self._max_t, self._eta, s, self._stop_last_trials))
            if r0 > 0:
                return len(self._bands) - 1, s
            band[-1].n = 0  # too small a bracket: none of its trials, the next one instead

    def _bracket(self, where: tuple[int, int]) -> _Bracket:
        return self._bands[where[0]][where[1]]

    def on_trial_result(self, tune_controller: TuneController, trial: Trial,
                        result: dict[str, Any]) -> str:
        bracket = self._bracket(self._trial_info[trial.trial_id])
        if trial.trial_id not in bracket.live:
            return TrialScheduler.CONTINUE  # halved away already; its stop is on its way
        bracket.update(trial.trial_id, result)
        if bracket.goes_on(trial.trial_id):
            return TrialScheduler.CONTINUE
        return self._process(tune_controller, bracket, trial.trial_id)

    def _process(self, tune_controller: TuneController, bracket: _Bracket,
                 reporting: str | None) -> str:
        """At a rung: once every trial reached it, halve; the reporting trial's action."""
        action = TrialScheduler.PAUSE
        if not bracket.rung_done():
            return action
        if bracket.finished():
            self._stop_paused(tune_controller, bracket, list(bracket.live))
            return TrialScheduler.STOP
        bracket.processing = True
        try:
            good, bad = bracket.halve(self._metric or DEFAULT_METRIC, metric_sign(self._mode))
            self._num_stopped += len(bad)
            for trial_id in bad:
                if trial_id == reporting:
                    bracket.cleanup(trial_id)
                    action = TrialScheduler.STOP
                else:
                    self._stop_paused(tune_controller, bracket, [trial_id])
            for trial_id in good:
                if not bracket.goes_on(trial_id):
                    continue
                if trial_id == reporting:
                    action = TrialScheduler.CONTINUE
                else:
                    bracket.to_unpause.add(trial_id)
        finally:
            bracket.processing = False
        return action

    def _stop_paused(self, tune_controller: TuneController, bracket: _Bracket,
                     trial_ids: list[str]) -> None:
        for trial_id in trial_ids:
            trial = tune_controller.get_trial(trial_id)
            bracket.cleanup(trial_id)
            if trial is not None and trial.status in (PAUSED, PENDING):
                tune_controller.stop_trial(trial)

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        where = self._trial_info.get(trial.trial_id)
        if where is None:
            return
        bracket = self._bracket(where)
        bracket.cleanup(trial.trial_id)
        if not bracket.finished() and not bracket.processing and bracket.live:
            self._process(tune_controller, bracket, None)

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial,
                          result: dict[str, Any]) -> None:
        self.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: TuneController, trial: Trial) -> None:
        self.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: TuneController,
                            allow_recurse: bool = True) -> Trial | None:
        for band in self._bands:
            for bracket in sorted(band, key=lambda b: b.completion()):
                for trial_id in list(bracket.live):
                    trial = tune_controller.get_trial(trial_id)
                    if trial is None:
                        continue
                    if trial.status == PENDING or (trial.status == PAUSED
                                                   and trial_id in bracket.to_unpause):
                        return trial
        if not any(t.status == RUNNING for t in tune_controller.get_trials()):
            # Nothing runs that could complete a rung: halve the brackets whose trials all
            # wait at theirs (a bracket that num_samples left short).
            for band in self._bands:
                for bracket in band:
                    waiting = [tune_controller.get_trial(t) for t in bracket.live]
                    if any(t is not None and t.status == PAUSED for t in waiting):
                        self._process(tune_controller, bracket, None)
                        if allow_recurse:
                            return self.choose_trial_to_run(tune_controller, allow_recurse=False)
        return None

    def debug_string(self) -> str:
        lines = [f"Using HyperBand: num_stopped={self._num_stopped} total_brackets="
                 f"{sum(len(b) for b in self._bands)}"]
        for i, band in enumerate(self._bands):
            for bracket in band:
                lines.append(f"Round #{i}: bracket n={bracket.n} r={bracket.r} "
                             f"live={len(bracket.live)} progress={bracket.completion():.0%}")
        return "\n".join(lines)

    def _ends_budget(self, result: dict[str, Any]) -> bool:
        return bool(self._time_attr in result and result[self._time_attr] >= self._max_t)

    def _state(self) -> dict[str, Any]:
        return {"bands": [[dict(b.__dict__, to_unpause=set(b.to_unpause), live=dict(b.live))
                           for b in band] for band in self._bands],
                "trial_info": dict(self._trial_info), "current": self._current,
                "num_stopped": self._num_stopped, "metric": self._metric, "mode": self._mode}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._bands = []
        for band in state["bands"]:
            brackets = []
            for fields in band:
                bracket = _Bracket.__new__(_Bracket)
                bracket.__dict__.update(fields)
                brackets.append(bracket)
            self._bands.append(brackets)
        self._trial_info = {k: (v[0], v[1]) for k, v in state["trial_info"].items()}
        current = state["current"]
        self._current = (current[0], current[1]) if current else None
        self._num_stopped = state["num_stopped"]
        self._metric = self._metric or state["metric"]
        self._mode = self._mode or state["mode"]
