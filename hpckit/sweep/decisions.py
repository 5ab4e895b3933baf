"""How a running trial's reports reach the sweep's controller and its decision comes back.

On the trial's rank 0, each report's stop criterion (``RunConfig(stop=...)``, decided on rank
0 and agreed by every rank of the trial) is a :class:`ReportAsker`: it sends the report to the
controller and waits for its answer; PAUSE or STOP end the trial's run after that report's
checkpoint is committed (a pause's checkpoint is the one the trial resumes from). The way to
the controller is this process's :class:`Channel`, set by the placement running the trial:

- :class:`Direct`: the controller is in this process (trials one after another here, and the
  group of ranks that world rank 0 leads when trials are packed);
- :class:`Messages`: MPI messages to world rank 0, whose trial queue thread answers them
  (trials packed under mpirun/srun, or on the ranks ``python sweep.py`` started);
- :class:`Files`: a request file and an answer file in the sweep's folder on the shared
  filesystem (trials as Slurm job steps, :mod:`.allocated`), which the driver polls.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from hpckit.errors import HpckitError
from hpckit.run.ending import stop as _stop
from hpckit.run.mpi.waiting import receive_from, send_to

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

    from hpckit.sweep.controller import TuneController

RESULT, DECISION = 73, 74
POLL_S = 0.02
CONTINUE, PAUSE, STOP = "CONTINUE", "PAUSE", "STOP"


class Channel(Protocol):
    def result(self, index: int, metrics: dict[str, Any], criterion: bool) -> str: ...


_channel: Channel | None = None


@contextlib.contextmanager
def serving(channel: Channel) -> Iterator[None]:
    """Trials run in this process while the block runs report through ``channel``."""
    global _channel
    previous, _channel = _channel, channel
    try:
        yield
    finally:
        _channel = previous


class ReportAsker:
    """``RunConfig(stop=...)`` of a trial whose reports the controller decides on: the user's
    own stop criterion is kept (met: the trial ends as finished, the scheduler not asked)."""

    def __init__(self, index: int, user_stop: Any) -> None:
        self.index = index
        self.user_stop = user_stop
        self._last = time.monotonic()
        self._since_restore = 0
        self.said = "RunConfig(stop=...) is met"  # why the last report ended the trial's run

    def __call__(self, name: str, metrics: dict[str, Any]) -> bool:
        if _channel is None:
            raise HpckitError("a trial of a scheduled sweep ran outside its sweep; run it "
                              "through Tuner.fit()")
        iteration = metrics.get("training_iteration", 0)
        criterion = _stop.criterion_met(self.user_stop, name, metrics, iteration)
        now = time.monotonic()
        self._since_restore += 1
        sent = {**metrics, "time_this_iter_s": now - self._last,
                "iterations_since_restore": self._since_restore}
        self._last = now
        decision = _channel.result(self.index, sent, criterion)
        self.said = {PAUSE: "the sweep's scheduler pauses this trial",
                     STOP: "the sweep's scheduler stops this trial"}.get(
                         decision, "RunConfig(stop=...) is met") if not criterion else \
            "RunConfig(stop=...) is met"
        return decision in (PAUSE, STOP)


class Direct:
    """The controller in this process."""

    def __init__(self, controller: TuneController) -> None:
        self.controller = controller

    def result(self, index: int, metrics: dict[str, Any], criterion: bool) -> str:
        return self.controller.on_result(index, metrics, criterion)


class Messages:
    """The controller on world rank 0 (``comm``'s rank 0), answering from its queue thread."""

    def __init__(self, comm: Comm, controller: TuneController | None) -> None:
        self.comm = comm
        self.controller = controller  # on rank 0 itself: asked directly

    def result(self, index: int, metrics: dict[str, Any], criterion: bool) -> str:
        if self.controller is not None:
            return self.controller.on_result(index, metrics, criterion)
        send_to(self.comm, (index, metrics, criterion), 0, RESULT)
        answer: str = receive_from(self.comm, 0, DECISION)
        return answer


class Files:
    """The controller in the driver process, through ``folder`` on the shared filesystem: a
    trial writes ``report-<trial>-<n>.json``; the driver answers ``decision-<trial>-<n>.json``."""

    def __init__(self, folder: str, index: int) -> None:
        self.folder = folder
        self.count = 0
        self.index = index

    def result(self, index: int, metrics: dict[str, Any], criterion: bool) -> str:
        self.count += 1
        tag = f"{index}-{self.count}-{os.getpid()}"
        _write_json(os.path.join(self.folder, f"report-{tag}.json"),
                    {"index": index, "metrics": metrics, "criterion": criterion})
        answer = os.path.join(self.folder, f"decision-{tag}.json")
        while not os.path.exists(answer):
            time.sleep(POLL_S)
        with open(answer) as f:
            decision: str = json.load(f)
        os.unlink(answer)
        return decision


def answer_files(folder: str, controller: TuneController) -> None:
    """The driver's side of :class:`Files`: every report waiting in ``folder`` answered."""
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("report-") and name.endswith(".json")):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path) as f:
                asked = json.load(f)
        except (OSError, ValueError):
            continue  # not complete yet: written atomically, so only a race with its rename
        decision = controller.on_result(asked["index"], asked["metrics"], asked["criterion"])
        _write_json(os.path.join(folder, "decision-" + name[len("report-"):]), decision)
        os.unlink(path)


def _write_json(path: str, value: Any) -> None:
    with open(path + ".part", "w") as f:
        json.dump(value, f)
    os.replace(path + ".part", path)
