"""The trial scheduler's seam, as Ray Tune's ``TrialScheduler``: the sweep's controller
(:class:`hpckit.sweep.controller.TuneController`) tells the scheduler of each trial added, of
each result and of each trial's end, and the scheduler answers each result with ``CONTINUE``,
``PAUSE`` (the trial's checkpoint of that report is committed, its slot freed, and it runs
again from that checkpoint when the scheduler chooses it) or ``STOP``; it chooses which
pending or paused trial a free slot runs next.

Schedulers here know trials by ``trial_id``, so that their state is plain data that
``save``/``restore`` keep with the sweep (``search-state-*.pkl`` beside ``sweep.json``).
"""

from __future__ import annotations

import pickle
from typing import Any

from hpckit.errors import ConfigError

# What a scheduler is given: the sweep's controller (hpckit.sweep.controller.TuneController,
# as Ray's) and its trials (hpckit.sweep.controller.Trial); named, not imported, since the
# controller holds the schedulers.
TuneController = Any
Trial = Any

DEFAULT_METRIC = "_metric"  # Ray's anonymous metric, when a scheduler is given none


class TrialScheduler:
    """As ``ray.tune.schedulers.TrialScheduler``: subclass it for a scheduler of your own
    (override ``on_trial_result`` and ``choose_trial_to_run`` at least; ``save`` and
    ``restore`` to keep its state across a rerun of the sweep)."""

    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"
    NOOP = "NOOP"

    _metric: str | None = None
    _supports_buffered_results = True

    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def supports_buffered_results(self) -> bool:
        return self._supports_buffered_results

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Take TuneConfig's metric and mode where the scheduler was given none; False when
        it has its own metric already.

        Args:
            metric: the metric to optimise.
            mode: "min" or "max".
            **spec: further properties (unused).
        """
        if self._metric and metric:
            return False
        if metric:
            self._metric = metric
        if self._metric is None:
            self._metric = DEFAULT_METRIC
        return True

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        """A trial was added to the sweep.

        Args:
            tune_controller: The sweep's controller (``get_trials``, ``get_trial``,
                ``stop_trial``, ``pause_trial``).
            trial: The trial (``trial_id``, ``config``, ``status``, ``last_result``,
                ``checkpoint``).
        """
        raise NotImplementedError

    def on_trial_error(self, tune_controller: TuneController, trial: Trial) -> None:
        """A running trial failed.

        Args:
            tune_controller: The sweep's controller.
            trial: The trial that failed.
        """
        raise NotImplementedError

    def on_trial_result(self, tune_controller: TuneController, trial: Trial,
                        result: dict[str, Any]) -> str:
        """A running trial reported ``result``: CONTINUE, PAUSE or STOP.

        Args:
            tune_controller: The sweep's controller.
            trial: The trial that reported.
            result: Its report's metrics, with ``training_iteration`` (the trial's own
                count of reports).

        Returns:
            ``CONTINUE``, ``PAUSE`` (its checkpoint of that report is committed and its slot
            freed) or ``STOP``.
        """
        raise NotImplementedError

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial,
                          result: dict[str, Any]) -> None:
        """A running trial ended: its function returned, or it was stopped.

        Args:
            tune_controller: The sweep's controller.
            trial: The trial that ended.
            result: Its last report's metrics.
        """
        raise NotImplementedError

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        """A pending or paused trial was stopped.

        Args:
            tune_controller: The sweep's controller.
            trial: The trial that was stopped.
        """
        raise NotImplementedError

    def choose_trial_to_run(self, tune_controller: TuneController) -> Trial | None:
        """A pending or paused trial for a free slot, or None.

        Args:
            tune_controller: The sweep's controller, whose ``get_trials()`` lists the
                trials with their status.
        """
        raise NotImplementedError

    def debug_string(self) -> str:
        raise NotImplementedError

    def save(self, checkpoint_path: str) -> None:
        """Write the scheduler's state to ``checkpoint_path``.

        Args:
            checkpoint_path: A local file to write, kept with the sweep.
        """
        raise NotImplementedError

    def restore(self, checkpoint_path: str) -> None:
        """Read back what :meth:`save` wrote.

        Args:
            checkpoint_path: The file :meth:`save` wrote, when the sweep runs again.
        """
        raise NotImplementedError

    def _ends_budget(self, result: dict[str, Any]) -> bool:
        """Whether a STOP at ``result`` ends the trial's whole budget (max_t reached) rather
        than stopping it early: hpckit's own, for the trial's history."""
        return False


class FIFOScheduler(TrialScheduler):
    """As ``ray.tune.schedulers.FIFOScheduler``: trials run in the order they were added,
    pending ones before paused ones, each to its end."""

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        pass

    def on_trial_error(self, tune_controller: TuneController, trial: Trial) -> None:
        pass

    def on_trial_result(self, tune_controller: TuneController, trial: Trial,
                        result: dict[str, Any]) -> str:
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial,
                          result: dict[str, Any]) -> None:
        pass

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        pass

    def choose_trial_to_run(self, tune_controller: TuneController) -> Trial | None:
        trials = tune_controller.get_trials()
        for status in ("PENDING", "PAUSED"):
            for trial in trials:
                if trial.status == status:
                    return trial
        return None

    def debug_string(self) -> str:
        return "Using FIFO scheduling algorithm."

    def save(self, checkpoint_path: str) -> None:
        _dump(checkpoint_path, self._state())

    def restore(self, checkpoint_path: str) -> None:
        self._set_state(_load(checkpoint_path))

    def _state(self) -> dict[str, Any]:
        """The scheduler's changing state, as plain data keyed by trial ids."""
        return {}

    def _set_state(self, state: dict[str, Any]) -> None:
        pass


class RankingScheduler(FIFOScheduler):
    """A scheduler that ranks trials by a metric in a mode (ASHA, HyperBand, the median rule,
    PBT): its own where it was given them, else TuneConfig's."""

    _mode: str | None = None

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if self._metric and self._mode:
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        return True

    def _require_metric(self) -> None:
        """Before a trial is added: a ranking needs both (ConfigError saying where to pass them)."""
        if not self._metric or not self._mode:
            raise ConfigError(f"{type(self).__name__} needs a metric and a mode: pass them to "
                              "it, or to TuneConfig(metric=..., mode=...).")


def check_mode(owner: str, mode: str | None) -> None:
    if mode not in (None, "min", "max"):
        raise ConfigError(f"{owner}(mode={mode!r}) is invalid: use 'max' (higher is better) "
                          "or 'min' (lower is better).")


def check_positive(owner: str, name: str, value: Any, minimum: float = 0.0,
                   strict: bool = True) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (value <= minimum if strict else value < minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ConfigError(f"{owner}({name}={value!r}) must be a number {bound}.")


def metric_sign(mode: str | None) -> float:
    """1 when higher is better, -1 when lower is: scores are compared as sign × metric."""
    return -1.0 if mode == "min" else 1.0


def _dump(path: str, state: dict[str, Any]) -> None:
    with open(path, "wb") as f:
        pickle.dump(state, f)


def _load(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        state: dict[str, Any] = pickle.load(f)
    return state
