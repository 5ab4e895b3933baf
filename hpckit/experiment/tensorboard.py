"""TensorBoard scalars for every report, when the optional ``tensorboard`` package is there."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from typing import Any

from hpckit import settings
from hpckit.errors import StorageError
from hpckit.logs import log
from hpckit.storage.copy import persist_file
from hpckit.storage.location import Location

DIRECTORY = "tensorboard"
UPLOAD_EVERY = 10.0  # seconds: remote event files are re-sent whole, so not at every report
# seconds between flushes: a flush per report cost rank 0 0.1 ms of every metrics-only
# report (a training step's time: the other ranks wait for it); TensorBoard rereads the file
# every few seconds anyway, and closing the run flushes the rest
FLUSH_EVERY = 1.0


def _installed() -> bool:
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # a broken or blocked installation counts as none
        return False


class Scalars:
    """Writes rank 0's numeric metrics as scalar events under ``{experiment}/tensorboard``.

    On remote storage the events are written to a node-local directory and uploaded from
    there, since TensorBoard's writer only appends to local files.
    """

    def __init__(self, writer: Any, staging: str | None, remote: Location | None) -> None:
        self.writer = writer
        self.staging = staging
        self.remote = remote
        self.uploaded = 0.0
        self.flushed = 0.0

    @classmethod
    def open(cls, experiment: Location) -> Scalars | None:
        """A writer, or None when tensorboard is not installed or ``HPCKIT_TENSORBOARD=0``
        turns it off (its import costs rank 0 about half a second at start)."""
        if not settings.current().tensorboard or not _installed():
            return None
        # tensorboard's own writer, not torch's: a run without torch must not import it.
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        target = experiment.join(DIRECTORY)
        if experiment.is_local:
            return cls(EventFileWriter(target.path), None, None)
        staging = tempfile.mkdtemp(prefix="hpckit-tensorboard-", dir=settings.current().local_dir)
        return cls(EventFileWriter(staging), staging, target)

    def restart(self, step: int) -> None:
        """A resumed run reports ``step`` and the steps after it again: TensorBoard drops
        the events it holds from ``step`` on when it reads this one (a session start, as
        TensorFlow writes after a restart), so that each step shows once, as last reported."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.writer.add_event(Event(wall_time=time.time(), step=step,
                                    session_log=SessionLog(status=SessionLog.START)))

    def add(self, step: int, metrics: dict[str, Any]) -> None:
        self._add(step, metrics)
        if time.monotonic() - self.flushed >= FLUSH_EVERY:
            self.flushed = time.monotonic()
            self.writer.flush()
        if self.remote is not None and time.monotonic() - self.uploaded >= UPLOAD_EVERY:
            self._upload()

    def _add(self, step: int, metrics: dict[str, Any]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=value)
                  for tag, value in _scalars(metrics, "")]
        if values:
            self.writer.add_event(Event(wall_time=time.time(), step=step,
                                        summary=Summary(value=values)))

    def _upload(self) -> None:
        if self.staging is None or self.remote is None:
            return  # written in place: nothing to upload
        self.uploaded = time.monotonic()
        for name in os.listdir(self.staging):
            try:
                persist_file(os.path.join(self.staging, name), self.remote.join(name))
            except StorageError as exc:
                log.warning("could not upload TensorBoard events (training goes on): %s", exc)

    def close(self) -> None:
        self.writer.close()
        if self.staging is not None:
            self._upload()
            shutil.rmtree(self.staging, ignore_errors=True)


def _scalars(metrics: dict[str, Any], prefix: str) -> list[tuple[str, float]]:
    """Numeric metrics as (tag, value); nested dicts become ``outer/inner`` tags."""
    found = []
    for key, value in metrics.items():
        if isinstance(value, dict):
            found.extend(_scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append((f"{prefix}{key}", float(value)))
    return found
