"""One run writes an experiment at a time: a lock file naming its holder, kept fresh.

``{experiment}/.hpckit-lock.json`` holds the host, pid, Slurm job and run of rank 0, and the
time it last refreshed the file. A second run fails fast naming the holder. A lock is stale
when its holder's pid is gone from this host, or when it was not refreshed for
``HPCKIT_LOCK_STALE_SECONDS`` (default 300; the holder refreshes every fifth of that): a
killed job's lock is then taken over, with a warning. A later attempt of the same run (hpckit
restarting failed ranks, or a requeued Slurm job) takes its own lock over silently.

On a local or shared filesystem the lock is created with O_EXCL, so two runs starting at the
same moment cannot both win. Object stores have no create-if-absent in pyarrow: there the run
writes the lock, reads it back, and yields if another run's token is found.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import NoReturn

import pyarrow.fs

from hpckit.errors import ExperimentLockedError, HpckitError
from hpckit.logs import log
from hpckit.processes import alive
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location

LOCK_NAME = ".hpckit-lock.json"


@dataclass(frozen=True)
class Holder:
    token: str
    host: str
    pid: int
    job_id: str | None
    run_id: str | None
    started_at: float
    refreshed_at: float

    def describe(self) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        return (f"host {self.host}, pid {self.pid}{job}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started_at))}")

    def stale(self, now: float, stale_after: float) -> str | None:
        """Why this holder is surely gone, or None while it may be alive."""
        if self.host == socket.gethostname() and not alive(self.pid):
            return f"pid {self.pid} no longer runs on {self.host}"
        if now - self.refreshed_at > stale_after:
            return f"not refreshed for {now - self.refreshed_at:.0f} s (stale after {stale_after:.0f} s)"
        return None


class Lock:
    """The experiment's lock, held by this process (rank 0) until :meth:`release`."""

    def __init__(self, location: Location, holder: Holder, every: float) -> None:
        self.location = location
        self.holder = holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, args=(every,), daemon=True,
                                        name="hpckit-lock")
        self._thread.start()

    @classmethod
    def acquire(cls, experiment: Location, settings: Settings) -> Lock:
        location = experiment.join(LOCK_NAME)
        limit = settings.lock_stale_seconds
        now = time.time()
        me = Holder(uuid.uuid4().hex, socket.gethostname(), os.getpid(), settings.slurm_job_id,
                    settings.lock_run_id, now, now)
        current = read(location)
        if current is not None:
            if current.run_id is not None and current.run_id == me.run_id:
                log.info("taking over the lock of an earlier attempt of this run (%s)",
                         current.describe())
            else:
                reason = current.stale(now, limit)
                if reason is None:
                    raise ExperimentLockedError(
                        f"experiment {experiment.display} is in use by another run ({current.describe()}); "
                        f"two runs writing one experiment would corrupt it. Wait for that run, "
                        f"choose another RunConfig(name=...), or, if it is dead, remove "
                        f"{location.display} (a dead run's lock also expires {limit:.0f} s after "
                        f"its last refresh).")
                log.warning("taking over the stale lock of %s: %s", current.describe(), reason)
            _take(location, me)
        else:
            _create(location, me)
        return cls(location, me, max(1.0, limit / 5))

    def _refresh(self, every: float) -> None:
        while not self._stop.wait(every):
            fresh = Holder(**{**asdict(self.holder), "refreshed_at": time.time()})
            try:
                current = read(self.location)
                if current is not None and current.token != self.holder.token:
                    log.error("the experiment's lock was taken by %s; this run no longer holds "
                              "it", current.describe())
                    return
                files.write_atomic(self.location, _encode(fresh))
                self.holder = fresh
            except HpckitError as exc:
                log.warning("could not refresh the experiment's lock (retrying): %s", exc)

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            current = read(self.location)
            if current is not None and current.token == self.holder.token:
                files.delete_file(self.location, missing_ok=True)
        except HpckitError as exc:
            log.warning("could not remove the experiment's lock (the next run will find it "
                        "stale): %s", exc)


def read(location: Location) -> Holder | None:
    if files.file_type(location) == pyarrow.fs.FileType.NotFound:
        return None
    try:
        return Holder(**json.loads(files.read_bytes(location)))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        log.warning("ignoring an unreadable lock %s: %s", location.display, exc)
        return Holder("", "?", 0, None, None, 0.0, 0.0)


def _encode(holder: Holder) -> bytes:
    return json.dumps(asdict(holder), indent=1).encode()


def _take(location: Location, me: Holder) -> None:
    """Replace a dead (or our own run's) lock without racing another run doing the same."""
    if location.is_local:
        aside = f"{location.path}.stale-{me.token[:8]}"
        try:
            os.rename(location.path, aside)
        except FileNotFoundError:
            pass  # another run moved it first; O_EXCL below decides who wins
        else:
            os.unlink(aside)
    _create(location, me)


def _create(location: Location, me: Holder) -> None:
    data = _encode(me)
    if location.is_local:
        with files.errors_named(location, "create the lock"):
            try:
                fd = os.open(location.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                _lost(location)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return
    files.write_bytes(location, data)
    time.sleep(0.2)  # let a run that wrote at the same moment land, then see who won
    current = read(location)
    if current is None or current.token != me.token:
        _lost(location)


def _lost(location: Location) -> NoReturn:
    winner = read(location)
    who = winner.describe() if winner else "another run"
    raise ExperimentLockedError(
        f"experiment {location.parent.display} was locked by {who} while this run started; "
        "two runs may not write one experiment. Choose another RunConfig(name=...).")
