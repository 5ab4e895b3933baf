"""The experiment's runs in experiment trackers (``RunConfig(callbacks=[MLflowLoggerCallback()])``
and the like) and its TensorBoard events: opened with the experiment (the runs the manifest
records opened again), each step's metrics handed to them by the experiment's writer, and
ended as the attempt ends. A run says which step it lacks first (``TrackerRun.next_step``,
read from the tracker itself when it opens again), so a step reported again after a restore
is not sent twice; TensorBoard is told that the steps from the resumed one are done again
and shows the new ones only (``Scalars.restart``). A tracker that fails is warned of and
left out: tracking never ends a training run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpckit.config.callbacks import TrackedExperiment, TrackerCallback, TrackerRun
from hpckit.errors import HpckitError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.reading import read_manifest
from hpckit.experiment.tensorboard import Scalars
from hpckit.logs import log
from hpckit.storage.location import Location

ENDED_AS = {AttemptStatus.FINISHED: "FINISHED", AttemptStatus.FAILED: "FAILED",
            AttemptStatus.HUNG: "FAILED"}  # any other end (interrupted, stopped, requeued): KILLED


class Trackers:
    """Rank 0's tracker runs of one open experiment; held by its metrics log."""

    def __init__(self, runs: dict[str, TrackerRun], scalars: Scalars | None = None) -> None:
        self.runs = runs
        self.scalars = scalars

    @classmethod
    def open(cls, callbacks: Iterable[TrackerCallback], recorded: dict[str, str],
             experiment: TrackedExperiment, scalars: Scalars | None) -> Trackers:
        """Each callback's run: the one ``recorded`` in the manifest, or a new one."""
        runs: dict[str, TrackerRun] = {}
        for callback in callbacks:
            try:
                runs[callback.tracker] = callback.open_run(recorded.get(callback.tracker),
                                                           experiment)
            except Exception as exc:  # noqa: BLE001  (a tracker never ends the run)
                log.warning("could not open the %s run of experiment %s; training goes on "
                            "without it: %s", callback.tracker, experiment.name, exc)
        return cls(runs, scalars)

    @property
    def run_ids(self) -> dict[str, str]:
        """Each open run's id, by tracker: what the manifest records."""
        return {name: run.run_id for name, run in self.runs.items()}

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Rank 0's metrics of the report at ``step``, to each run that lacks it."""
        if self.scalars is not None:
            self.scalars.add(step, metrics)
        for name, run in list(self.runs.items()):
            if step < run.next_step:
                continue
            try:
                run.log(step, metrics)
                run.next_step = step + 1
            except Exception as exc:  # noqa: BLE001  (a tracker never ends the run)
                log.warning("the %s run %s receives no more metrics (training goes on): %s",
                            name, run.run_id, exc)
                del self.runs[name]

    def end(self, status: AttemptStatus) -> None:
        """The attempt ended: each run ends as it did (a resume opens it again)."""
        ended = ENDED_AS.get(status, "KILLED")
        for name, run in self.runs.items():
            try:
                run.end(ended)
            except Exception as exc:  # noqa: BLE001  (a tracker never ends the run)
                log.warning("could not end the %s run %s as %s: %s", name, run.run_id, ended, exc)
        self.runs = {}

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()


def end_recorded(location: Location, callbacks: Iterable[TrackerCallback],
                 experiment: TrackedExperiment, status: AttemptStatus) -> None:
    """End the tracker runs the manifest records as the experiment's last attempt ended,
    where its rank 0 could not (it was killed): by the process that launched the ranks."""
    try:
        recorded = read_manifest(location)
    except HpckitError as exc:
        log.debug("could not read %s to end its tracker runs: %s", location.display, exc)
        return
    if recorded is None or not recorded.tracker_runs:
        return
    mine = [c for c in callbacks if c.tracker in recorded.tracker_runs]
    Trackers.open(mine, recorded.tracker_runs, experiment, None).end(status)
