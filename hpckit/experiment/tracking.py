"""The experiment's runs in experiment trackers (``RunConfig(callbacks=[MLflowLoggerCallback()])``
and the like) and its TensorBoard events.

Every call to a tracker goes over the network to a service outside the job, so none is made
on the training path or inside a commit: a thread of the :class:`Trackers` (a daemon: a
tracker that does not answer never holds the process at its exit) opens the runs once the
attempt's first report is committed (the ones the manifest records opened again, a new one
where none is or where the recorded one was deleted in the tracker), logs each step's
metrics once the report they belong to is committed (a line retracted later was never
sent), and ends the runs as the attempt ends, waited for at most :data:`END_WAIT_S`. A run
says which step it lacks first
(``TrackerRun.next_step``, read from the tracker itself when it opens again), so a step
reported again after a restore is not sent twice; TensorBoard (local files, through its own
writer thread) is told that the steps from the resumed one are done again and shows the new
ones only (``Scalars.restart``). A tracker that fails is warned of once and left out:
tracking never stalls or ends a training run.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from hpckit.config.callbacks import TrackedExperiment, TrackerCallback, TrackerRun
from hpckit.errors import HpckitError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.reading import read_manifest, read_metrics
from hpckit.experiment.tensorboard import Scalars
from hpckit.logs import log
from hpckit.storage.location import Location

ENDED_AS = {AttemptStatus.FINISHED: "FINISHED", AttemptStatus.FAILED: "FAILED",
            AttemptStatus.HUNG: "FAILED"}  # any other end (interrupted, stopped, requeued): KILLED
END_WAIT_S = 30.0  # how long an attempt's end waits for its trackers to take what is queued


class Trackers:
    """Rank 0's tracker runs of one open experiment; held by its metrics log (and, for the
    runs a training function starts itself, by its session)."""

    def __init__(self, runs: dict[str, TrackerRun] | None = None,
                 scalars: Scalars | None = None) -> None:
        self.runs: dict[str, TrackerRun] = dict(runs or {})
        self.scalars = scalars
        self._ids: dict[str, str] = {}  # known before the run opens (recorded, or chosen here)
        self._changing = threading.Lock()
        self._feed = _Feed()
        self._unopened: list[Callable[[], None]] = []  # handed to the thread at the first commit

    @classmethod
    def open(cls, callbacks: Iterable[TrackerCallback], recorded: dict[str, str],
             experiment: TrackedExperiment, scalars: Scalars | None,
             history: list[dict[str, Any]] | None = None) -> Trackers:
        """Each callback's run, opened on the trackers' thread once the attempt's first
        report is committed (so that opening it never competes with the start of training):
        the one ``recorded`` in the manifest, or a new one; then sent the committed lines of
        ``history`` (metrics.jsonl's) it lacks, which an earlier attempt committed and had not
        sent when it ended."""
        trackers = cls({}, scalars)
        for callback in callbacks:
            run_id = recorded.get(callback.tracker) or callback.new_run_id()
            if run_id is not None:
                trackers._ids[callback.tracker] = run_id
            trackers._unopened.append(partial(trackers._open, callback, run_id, experiment,
                                              history or []))
        return trackers

    def _start_opening(self) -> None:
        """Hand the thread the runs to open, ahead of whatever a caller hands it next (under
        the lock, so that no caller's work overtakes them)."""
        with self._changing:
            for work in self._unopened:
                self._feed.put(work)
            self._unopened = []

    def _open(self, callback: TrackerCallback, run_id: str | None,
              experiment: TrackedExperiment, history: list[dict[str, Any]]) -> None:
        try:
            run = callback.open_run(run_id, experiment)
        except Exception as exc:  # noqa: BLE001  (a tracker never ends the run)
            log.warning("could not open the %s run of experiment %s; training goes on "
                        "without it: %s", callback.tracker, experiment.name, exc)
            with self._changing:
                self._ids.pop(callback.tracker, None)
            return
        with self._changing:
            self.runs[callback.tracker] = run
            self._ids[callback.tracker] = run.run_id
        for line in history:
            self._send(callback.tracker, run, line["step"], line.get("metrics") or {})

    @property
    def run_ids(self) -> dict[str, str]:
        """Each run's id, by tracker, as far as it is known: what the manifest records."""
        with self._changing:
            return {**self._ids, **{name: run.run_id for name, run in self.runs.items()}}

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Rank 0's metrics of the committed report at ``step``: TensorBoard's now, each
        tracker run's (where it lacks the step) on the trackers' thread."""
        if self.scalars is not None:
            self.scalars.add(step, metrics)
        self._start_opening()
        self._feed.put(lambda: self._log(step, metrics))

    def _log(self, step: int, metrics: dict[str, Any]) -> None:
        for name, run in list(self.runs.items()):
            self._send(name, run, step, metrics)

    def _send(self, name: str, run: TrackerRun, step: int, metrics: dict[str, Any]) -> None:
        """``step``'s metrics to ``run``, where it lacks them; a run that fails is left out."""
        if step < run.next_step or name not in self.runs:
            return
        try:
            run.log(step, metrics)
            run.next_step = step + 1
        except Exception as exc:  # noqa: BLE001  (a tracker never ends the run)
            log.warning("the %s run %s receives no more metrics (training goes on): %s",
                        name, run.run_id, exc)
            with self._changing:
                del self.runs[name]

    def end(self, status: AttemptStatus, wait: float = END_WAIT_S) -> None:
        """The attempt ended: each run ends as it did (a resume opens it again), after what
        is queued; waited for at most ``wait`` seconds."""
        ended = ENDED_AS.get(status, "KILLED")
        self._start_opening()
        self._feed.put(lambda: self._end(ended))
        self._feed.stop()  # its thread ends once it has done what it holds
        if not self._feed.drained(wait):
            log.warning("the experiment trackers (%s) did not take the last %d step(s) and the "
                        "end of the attempt within %.0f s; they are left as they are",
                        ", ".join(sorted(self.run_ids)) or "opening", self._feed.pending(),
                        wait)

    def _end(self, ended: str) -> None:
        for name, run in list(self.runs.items()):
            try:
                run.end(ended)
            except Exception as exc:  # noqa: BLE001  (a tracker never ends the run)
                log.warning("could not end the %s run %s as %s: %s", name, run.run_id, ended, exc)
        with self._changing:
            self.runs = {}

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()


class _Feed:
    """The trackers' thread: what it is handed, in order, started at the first piece."""

    def __init__(self) -> None:
        self._work: deque[Callable[[], None]] = deque()
        self._changed = threading.Condition()
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def put(self, work: Callable[[], None]) -> None:
        with self._changed:
            self._work.append(work)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hpckit-trackers",
                                                daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def stop(self) -> None:
        """The thread ends once it has done what it holds (a later ``put`` starts another)."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def pending(self) -> int:
        with self._changed:
            return len(self._work) + self._busy

    def drained(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until everything handed over is done."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._work and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._work) or self._stopping)
                if not self._work:
                    self._stopping = False
                    return
                work = self._work.popleft()
                self._busy = True
            try:
                work()
            except Exception as exc:  # noqa: BLE001  (each piece warns of its own failures)
                log.warning("an experiment tracker failed: %s", exc)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()


def end_recorded(location: Location, callbacks: Iterable[TrackerCallback],
                 experiment: TrackedExperiment, status: AttemptStatus) -> None:
    """End the experiment's tracker runs as its last attempt ended, where its rank 0 could
    not (it was killed): by the process that launched the ranks. Each is the run the
    manifest records (or, where the attempt died before it was recorded, the tracker's run
    of this experiment, or a new one), first sent the committed steps it lacks."""
    try:
        recorded = read_manifest(location)
    except HpckitError as exc:
        log.debug("could not read %s to end its tracker runs: %s", location.display, exc)
        return
    if recorded is None:
        return
    try:
        history = read_metrics(location)
    except HpckitError as exc:
        log.debug("could not read the metrics of %s for its tracker runs: %s",
                  location.display, exc)
        history = []
    committed = [line for line in history if line["step"] < recorded.next_step]
    Trackers.open(callbacks, recorded.tracker_runs, experiment, None, committed).end(status)
