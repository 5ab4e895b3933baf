"""The sweep's decisions, in one room: Ray Tune's ``TuneController`` on hpckit. It holds the
trials, the scheduler and the search algorithm; it hands each free slot its next trial
(:meth:`TuneController.next_trial`), answers each report of a running trial with the
scheduler's decision (:meth:`TuneController.on_result`: CONTINUE, PAUSE or STOP), and hears
how each trial's run ended (:meth:`TuneController.on_ended`). Whichever placement runs the
trials (:mod:`.packed`, :mod:`.allocated`, one after another here), they reach it through
:mod:`.decisions`; it lives in one process, the sweep's rank 0, and a lock keeps it whole
while several slots ask at once.

After every change it saves the sweep: the state of the scheduler and the search algorithm
and the trials' exact params go to a new ``search-state-*.pkl`` first, then ``sweep.json``
names it (the commit), so that a rerun, a requeued job or ``Tuner.restore`` goes on with the
same search and never repeats a trial. A sweep with neither (FIFO over the planned grid)
writes sweep.json alone, as before schedulers existed.
"""

from __future__ import annotations

import pickle
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from hpckit.checkpoint import Checkpoint, checkpoint_at
from hpckit.errors import ConfigError, ManifestError
from hpckit.experiment.reading import read_manifest
from hpckit.experiment.values import flatten, jsonable
from hpckit.logs import log
from hpckit.storage.location import Location
from hpckit.sweep import record as rec
from hpckit.sweep.record import SweepManifest, SweepRecord
from hpckit.sweep.schedulers.base import FIFOScheduler, TrialScheduler
from hpckit.sweep.search.searcher import restore_bytes, saved_bytes

WAIT = "WAIT"  # no trial for a slot now; ask again soon (a running trial may free one)
STATE_FORMAT = 1


@dataclass(frozen=True)
class Assignment:
    """A trial for a slot: its record, exact params, and, after an exploit, the trial whose
    newest committed checkpoint it continues from (that trial's directory name)."""

    trial: rec.Trial
    params: dict[str, Any]
    donor: str | None = None
    live: bool = False  # the trial's reports go to the controller


class Trial:
    """A trial as Ray's ``Trial`` shows it to schedulers and search algorithms: ``trial_id``,
    ``config``, ``status``, ``last_result``, ``checkpoint`` (its newest committed), ``path``."""

    PENDING, RUNNING, PAUSED = rec.PENDING, rec.RUNNING, rec.PAUSED
    TERMINATED, ERROR = rec.TERMINATED, rec.ERROR

    def __init__(self, record: rec.Trial, params: dict[str, Any], location: Location) -> None:
        self.index = record.index
        self.trial_id = record.trial_id
        self.dirname = record.dirname
        self.config = params
        self.status = record.status
        self.last_result: dict[str, Any] = dict(record.last)
        self.location = location
        self.experiment_tag = record.dirname

    @property
    def path(self) -> str:
        return self.location.path

    @property
    def local_path(self) -> str:
        return self.location.path

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The trial's newest committed checkpoint, read from its manifest now."""
        manifest = read_manifest(self.location)
        if manifest is None or manifest.latest is None:
            return None
        return checkpoint_at(self.location.join(manifest.latest.directory))  # noqa: SLF001

    def is_finished(self) -> bool:
        return self.status in (rec.TERMINATED, rec.ERROR)

    def __str__(self) -> str:
        return self.dirname

    def __repr__(self) -> str:
        return f"Trial({self.dirname}, {self.status})"


class TuneController:
    """The sweep's trials and the decisions about them (see the module's docstring)."""

    def __init__(self, manifest: SweepManifest, params: dict[int, dict[str, Any]],
                 location: Location, writer: SweepRecord | None, scope: list[int],
                 search: Any = None, live: bool = False) -> None:
        self.location, self.writer = location, writer
        self.search = search  # a Search (hpckit.sweep.searching), or None for the plan alone
        self.scheduler: TrialScheduler = search.scheduler if search else FIFOScheduler()
        self.live = live
        self._lock = threading.RLock()
        self._manifest = manifest
        self._trials = {i: Trial(manifest.trials[i], params[i], location.join(
            manifest.trials[i].dirname)) for i in range(len(manifest.trials))}
        self._scope = list(scope)  # the trials this run may start, in order
        for index in self._scope:  # an errored trial resumed (resume_errored) runs again
            if self._trials[index].status in (rec.ERROR, rec.RUNNING):
                self._trials[index].status = rec.PENDING
        self._running: set[int] = set()
        self._ending: set[int] = set()  # told to pause or stop: runnable once their run ended
        self._donors: dict[int, str] = {}
        self._told: dict[int, str] = {}
        self._time_total: dict[int, float] = {
            i: float(t.last.get("time_total_s") or 0.0) for i, t in enumerate(manifest.trials)}
        self._state_version = 0
        self._saved = b""
        self._started = time.monotonic()
        self._budget_spent = False

    # --- what the placements ask --------------------------------------------------------

    @property
    def manifest(self) -> SweepManifest:
        with self._lock:
            return self._manifest

    def next_trial(self) -> Assignment | str | None:
        """The next trial for a free slot; :data:`WAIT` when none now but one may come (a
        running trial's result may resume a paused one, a search may suggest once trials
        end); None when the sweep has nothing left to run."""
        with self._lock:
            if self._over_budget():
                return WAIT if self._running else None
            trial = self._choose()
            if trial is None:
                if self._running or self._ending:
                    return WAIT
                return None
            return self._start(trial)

    def on_result(self, index: int, metrics: dict[str, Any], criterion: bool = False) -> str:
        """A running trial's report: CONTINUE, PAUSE or STOP (its run then ends after this
        report's checkpoint is committed). ``criterion``: the trial's RunConfig(stop=...) was
        met, which ends it as finished."""
        with self._lock:
            trial = self._trials[index]
            result = self._result(trial, metrics)
            if index in self._donors:  # it reports from the exploited checkpoint: done
                del self._donors[index]
            decision = self._decide(trial, result, criterion)
            if decision in (rec.PAUSE, rec.STOP):
                self._told[index] = decision
                self._ending.add(index)
                log.info("trial %s %s at iteration %s by %s", trial.dirname,
                         "pauses" if decision == rec.PAUSE else "stops",
                         result.get("training_iteration"),
                         "its stop criterion" if criterion else type(self.scheduler).__name__)
                trial.status = rec.PAUSED if decision == rec.PAUSE else trial.status
            self._record(index, decision=self._told.get(index))
            self._save()
            return decision

    def on_ended(self, ended: rec.Trial) -> None:
        """How a trial's run ended (as :meth:`Tuner._attempt` returns it): finished or stopped
        (TERMINATED), failed (ERROR), or interrupted (PENDING: it resumes later)."""
        with self._lock:
            index = ended.index
            trial = self._trials[index]
            told = self._told.pop(index, None)
            self._running.discard(index)
            self._ending.discard(index)
            if ended.status == rec.ERROR:
                self._failed(trial, ended)
            elif ended.status == rec.PENDING:
                trial.status = rec.PAUSED if told == rec.PAUSE else rec.PENDING
                self._record(index, status=trial.status)
            elif told == rec.PAUSE and trial.status == rec.PAUSED:
                self._record(index, status=rec.PAUSED, decision=None, last=ended.last,
                             event=self._event("paused", trial))
            elif trial.status != rec.TERMINATED:
                self._completed(trial, ended, told)
            self._save()

    def has_work(self) -> bool:
        """Whether a trial may still run: one waits in this run's scope, or the search
        algorithm may suggest more."""
        with self._lock:
            waiting = any(self._trials[i].status in (rec.PENDING, rec.PAUSED) for i in self._scope)
            return waiting or bool(self.search is not None and not self.search.finished)

    def get_trials_all(self) -> list[Trial]:
        """Every trial of the sweep, this run's or not."""
        with self._lock:
            return [self._trials[i] for i in sorted(self._trials)]

    # --- Ray's TuneController, as schedulers call it -------------------------------------

    def get_trials(self) -> list[Trial]:
        return [self._trials[i] for i in self._scope] if self._scope_only else list(
            self._trials.values())

    @property
    def _scope_only(self) -> bool:
        return self.search is None

    def get_live_trials(self) -> list[Trial]:
        return [t for t in self.get_trials() if not t.is_finished()]

    def get_trial(self, trial_id: str) -> Trial | None:
        return next((t for t in self._trials.values() if t.trial_id == trial_id), None)

    def stop_trial(self, trial: Trial) -> None:
        """Stop ``trial``: at once where it waits (pending, paused), at its next report where
        it runs."""
        if trial.is_finished():
            return
        if trial.status in (rec.PENDING, rec.PAUSED) and trial.index not in self._running:
            self.scheduler.on_trial_remove(self, trial)
            self._tell_searcher(trial, None, error=False)
            trial.status = rec.TERMINATED
            self._record(trial.index, status=rec.TERMINATED, decision=None,
                         event=self._event("stopped", trial))
        else:
            self._told[trial.index] = rec.STOP
            self._ending.add(trial.index)

    def pause_trial(self, trial: Trial, should_checkpoint: bool = True) -> None:
        """Pause ``trial``: a running one after its report's checkpoint is committed."""
        if trial.is_finished():
            return
        if trial.index in self._running:
            self._told[trial.index] = rec.PAUSE
            self._ending.add(trial.index)
        trial.status = rec.PAUSED

    def _exploit(self, trial: Trial, donor: Trial, config: dict[str, Any]) -> None:
        """PBT's exploit: ``trial`` continues with ``config`` from a copy of ``donor``'s
        newest committed checkpoint (made when it next starts, :mod:`.exploit`)."""
        iteration = trial.last_result.get("training_iteration")
        self._donors[trial.index] = donor.dirname
        trial.config = config
        self._record(trial.index, config=jsonable(config), event={
            "event": "exploited", "iteration": iteration, "donor": donor.trial_id,
            "before": self._manifest.trials[trial.index].config, "config": jsonable(config)})
        self._record(donor.index, event={"event": "donated", "iteration": donor.last_result.get(
            "training_iteration"), "to": trial.trial_id})
        self.pause_trial(trial)

    # --- inside --------------------------------------------------------------------------

    def _choose(self) -> Trial | None:
        if self.search is not None and not any(
                t.status == rec.PENDING for t in self.get_trials()):
            self._suggest()
        chosen = self.scheduler.choose_trial_to_run(self)
        if not isinstance(chosen, Trial) or chosen.index in self._ending or chosen.index in self._running:
            return None
        if chosen.index not in self._scope or chosen.status not in (rec.PENDING, rec.PAUSED):
            return None
        return chosen

    def _suggest(self) -> None:
        """A new trial from the search algorithm, where it has one to give."""
        if self.search is None:
            return
        created = self.search.suggest(len(self._trials), self._running)
        if created is None:
            return
        record, params = created
        trial = Trial(record, params, self.location.join(record.dirname))
        self._trials[record.index] = trial
        self._scope.append(record.index)
        self._manifest = self._manifest.with_trials((*self._manifest.trials, record))
        self._time_total[record.index] = 0.0
        self.scheduler.on_trial_add(self, trial)
        self._save()

    def _start(self, trial: Trial) -> Assignment:
        trial.status = rec.RUNNING
        self._running.add(trial.index)
        self._record(trial.index, status=rec.RUNNING, error=None)
        self._save()
        record = self._manifest.trials[trial.index]
        return Assignment(record, trial.config, self._donors.get(trial.index), self.live)

    def _result(self, trial: Trial, metrics: dict[str, Any]) -> dict[str, Any]:
        """The report as a scheduler sees it: flattened, with Ray's automatic fields."""
        this_iter = float(metrics.get("time_this_iter_s") or 0.0)
        self._time_total[trial.index] = self._time_total.get(trial.index, 0.0) + this_iter
        result = {**flatten(metrics), "time_this_iter_s": this_iter,
                  "time_total_s": self._time_total[trial.index], "trial_id": trial.trial_id,
                  "timestamp": int(time.time()), "done": False, "config": trial.config}
        trial.last_result = result
        return result

    def _decide(self, trial: Trial, result: dict[str, Any], criterion: bool) -> str:
        told = self._told.get(trial.index)
        if told is not None:
            return told
        if criterion:
            return rec.STOP
        if self._over_budget():
            return rec.STOP
        decision = self.scheduler.on_trial_result(self, trial, result)
        if decision != TrialScheduler.STOP and self.search is not None:
            self.search.on_trial_result(trial.trial_id, result)
        if trial.status == rec.PAUSED or decision == TrialScheduler.PAUSE:
            return rec.PAUSE
        if decision == TrialScheduler.STOP:
            self._told[trial.index] = rec.STOP
            if not self.scheduler._ends_budget(result):  # noqa: SLF001 (hpckit's own seam)
                self._record(trial.index, event=self._event("stopped", trial))
            return rec.STOP
        return TrialScheduler.CONTINUE

    def _completed(self, trial: Trial, ended: rec.Trial, told: str | None) -> None:
        trial.status = rec.TERMINATED
        result = {**trial.last_result, "done": True}
        self.scheduler.on_trial_complete(self, trial, result)
        self._tell_searcher(trial, result, error=False)
        self._record(trial.index, status=rec.TERMINATED, error=None, decision=None,
                     last=ended.last or jsonable(_shown(trial.last_result)))

    def _failed(self, trial: Trial, ended: rec.Trial) -> None:
        trial.status = rec.ERROR
        self.scheduler.on_trial_error(self, trial)
        self._tell_searcher(trial, trial.last_result or None, error=True)
        self._record(trial.index, status=rec.ERROR, error=ended.error, decision=None)

    def _tell_searcher(self, trial: Trial, result: dict[str, Any] | None, error: bool) -> None:
        if self.search is not None:
            self.search.on_trial_complete(trial.trial_id, result, error)

    def _over_budget(self) -> bool:
        budget = self.search.time_budget_s if self.search is not None else None
        if budget is None or time.monotonic() - self._started < budget:
            return False
        if not self._budget_spent:
            self._budget_spent = True
            log.warning("TuneConfig(time_budget_s=%s) is spent: running trials stop after their "
                        "next report, and no trial starts", budget)
            if self.search is not None:
                self.search.finished = True
        return True

    def _event(self, name: str, trial: Trial) -> dict[str, Any]:
        return {"event": name, "iteration": trial.last_result.get("training_iteration")}

    def _record(self, index: int, event: dict[str, Any] | None = None, **changes: Any) -> None:
        """The trial's record in the sweep manifest, changed (saved by :meth:`_save`)."""
        trial = self._manifest.trials[index]
        if event is not None:
            changes["events"] = (*trial.events, event)
        if "last" in changes:
            changes["last"] = {**(changes["last"] or {}),
                               "time_total_s": self._time_total.get(index, 0.0)}
        self._manifest = self._manifest.with_trial(replace(trial, **changes))

    def _save(self) -> None:
        """The state file first (when it changed), then sweep.json naming it."""
        if self.writer is None:
            return
        manifest = self._manifest
        if self.search is not None:
            state = self._state()
            if state != self._saved:
                self._state_version += 1
                previous = manifest.state
                name = self.writer.save_state(self._state_version, state)
                manifest = self._manifest = replace(manifest, state=name)
                self._saved = state
                self.writer.save(manifest)
                if previous and previous != name:
                    self.writer.remove_state(previous)
                return
        self.writer.save(manifest)

    def _state(self) -> bytes:
        if self.search is None:
            return b""
        exact = {i: t.config for i, t in self._trials.items()
                 if self.search.dynamic or i in self._exploited()}
        try:
            return pickle.dumps({"format": STATE_FORMAT, "scheduler": saved_bytes(self.scheduler),
                                 "searcher": self.search.saved(), "params": exact,
                                 "donors": dict(self._donors), "suggested": self.search.count,
                                 "finished": self.search.finished})
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ConfigError(f"the sweep's state cannot be saved ({exc}): keep param_space and "
                              "the scheduler's functions picklable (defined at module level, "
                              "not lambdas)") from exc

    def _exploited(self) -> set[int]:
        return {t.index for t in self._manifest.trials
                if any(e.get("event") == "exploited" for e in t.events)}

    def restore(self, data: bytes) -> None:
        """The scheduler's and search algorithm's state, as :meth:`_state` saved it."""
        if self.search is None:
            return
        try:
            state = pickle.loads(data)
        except Exception as exc:
            raise ManifestError(f"the sweep's state file is unreadable ({exc}); move sweep.json "
                                "and search-state-*.pkl aside to start the sweep anew") from exc
        for index, params in state["params"].items():
            if index in self._trials:
                self._trials[index].config = params
        self._donors = dict(state["donors"])
        if state["scheduler"] is not None:
            restore_bytes(self.scheduler, state["scheduler"])
        self.search.restore(state["searcher"], state["suggested"], state["finished"])
        self._saved = data
        self._state_version = _version(self._manifest.state)


def _shown(result: dict[str, Any]) -> dict[str, Any]:
    """A result without the fields that only a scheduler needs (for sweep.json's ``last``)."""
    return {k: v for k, v in result.items() if k not in ("config", "done", "trial_id", "timestamp")}


def _version(name: str | None) -> int:
    if not name:
        return 0
    digits = "".join(c for c in name if c.isdigit())
    return int(digits) if digits else 0


def resumed_statuses(manifest: SweepManifest) -> SweepManifest:
    """The sweep as a new run of its driver starts it: trials that were running are pending
    again (their own latest checkpoints resume them), unless the scheduler had told them to
    pause (paused) or stop (ended)."""
    trials = []
    for trial in manifest.trials:
        if trial.status == rec.RUNNING and trial.decision == rec.PAUSE:
            trial = replace(trial, status=rec.PAUSED, decision=None)
        elif trial.status == rec.RUNNING and trial.decision == rec.STOP:
            trial = replace(trial, status=rec.TERMINATED, decision=None)
        elif trial.status == rec.RUNNING:
            trial = replace(trial, status=rec.PENDING)
        trials.append(trial)
    return manifest.with_trials(tuple(trials))
