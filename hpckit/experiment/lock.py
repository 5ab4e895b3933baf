"""One run writes an experiment at a time: a lock file naming its holder, kept fresh, and a fence.

``{experiment}/.hpckit-lock.json`` holds the host, pid, Slurm job and run of rank 0, and the
time it last refreshed the file. A second run fails fast naming the holder. A lock is stale
when its holder's pid is gone from this host, or when it was not refreshed for
``HPCKIT_LOCK_STALE_SECONDS`` (default 300; the holder refreshes every fifth of that): a
killed job's lock is then taken over, with a warning. A later attempt of the same run (hpckit
restarting failed ranks, or a requeued Slurm job) takes its own lock over silently.

On a local or shared filesystem the lock is created with O_EXCL, so two runs starting at the
same moment cannot both win. Object stores have no create-if-absent in pyarrow: there the run
writes the lock, reads it back, and yields if another run's token is found.

The lock is a fence, not a log line: a run frozen past the stale time (a hung node, SIGSTOP)
may wake to find its experiment taken over. Its owner calls :meth:`Lock.confirm` right before
each write, which reads the file and raises :class:`ExperimentTakenError` unless it still
holds this run's token. The manifest, the record of what is committed, is replaced through
:meth:`Lock.write`, and on a local or shared filesystem that replacement is fenced exactly:
the new manifest is staged in the holder's fence directory (``.hpckit-fence-<token>``) and
renamed from there, and a run that takes the lock over first renames every other run's fence
directory away, so a rename that had passed its check a moment before the takeover either
landed before the taker reads the manifest or fails. Object stores have no conditional write
in pyarrow: there one write may still land between the check and the write. A refresh that
fails in any way is retried at the next interval; only once none succeeded for the stale time
(when another run may have judged the lock stale) is the lock lost. A lock file that holds
another run's token, or is gone, is lost at once.

What a run that lost the experiment's lock is told: who took the experiment over, and what
to do. Said once, as the one error every rank raises at the next ``report()``
(:class:`~hpckit.errors.ExperimentTakenError`), so it names the run that owns the experiment
now, and says that this run wrote nothing more and should not be restarted.

The run that took over may have ended and removed its lock by the time this one wakes: it is
then named from the newest attempt the manifest records that is not this run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import NoReturn

from hpckit.errors import ExperimentLockedError, ExperimentTakenError, HpckitError, StorageError
from hpckit.experiment.reading import read_manifest
from hpckit.logs import log
from hpckit.processes import alive
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location
from hpckit.storage.location import local as local_location

LOCK_NAME = ".hpckit-lock.json"
FENCE_PREFIX = ".hpckit-fence-"


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
        run = f", run {self.run_id}" if self.run_id and self.run_id != f"slurm-{self.job_id}" else ""
        return (f"host {self.host}, pid {self.pid}{job}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started_at))}{run}")

    def stale(self, now: float, stale_after: float) -> str | None:
        """Why this holder is surely gone, or None while it may be alive."""
        if self.host == socket.gethostname() and not alive(self.pid):
            return f"pid {self.pid} no longer runs on {self.host}"
        if now - self.refreshed_at > stale_after:
            return f"not refreshed for {now - self.refreshed_at:.0f} s (stale after {stale_after:.0f} s)"
        return None


UNREADABLE = Holder("", "?", 0, None, None, 0.0, 0.0)
"""A lock file that cannot be parsed: no run's (its token is no run's), stale at once."""


class Lock:
    """The experiment's lock, held by this process (rank 0) until :meth:`release` or until
    another run takes it over (:attr:`lost`)."""

    def __init__(self, location: Location, holder: Holder, every: float,
                 stale_after: float) -> None:
        self.location = location
        self.holder = holder
        self.every = every
        self.stale_after = stale_after
        # The lease: from the moment of our last refresh, no other run may judge it stale
        # for ``stale_after`` seconds. Monotonic, so a frozen process sees the time it lost.
        self._renewed = time.monotonic()
        self._fence = _fence_directory(location, holder) if location.is_local else None
        self._lost: ExperimentTakenError | None = None
        self._losing = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, daemon=True, name="hpckit-lock")
        self._thread.start()

    @classmethod
    def acquire(cls, experiment: Location, settings: Settings, force: bool = False) -> Lock:
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
                if reason is None and not force:
                    raise ExperimentLockedError(
                        f"experiment {experiment.display} is in use by another run ({current.describe()}); "
                        f"two runs writing one experiment would corrupt it. Wait for that run, "
                        f"choose another RunConfig(name=...), or, if it is dead, remove "
                        f"{location.display} (a dead run's lock also expires {limit:.0f} s after "
                        f"its last refresh).")
                log.warning("taking over the %s of %s: %s", "stale lock" if reason else "lock",
                            current.describe(), reason or "forced (it may be alive)")
            _take(location, me, current)
        else:
            _create(location, me)
        if location.is_local:
            _fence_out(location, me)
        return cls(location, me, max(1.0, limit / 5), limit)

    @property
    def lost(self) -> ExperimentTakenError | None:
        """Why this run no longer holds the lock (the error its next write raises), or None."""
        return self._lost

    def confirm(self) -> None:
        """Right before a write to the experiment: one read of the lock file; raises
        :class:`ExperimentTakenError` unless it still holds this run's token (a storage error
        as it comes: the write would have failed the same)."""
        if self._lost is not None:
            raise self._lost
        current = read(self.location)
        if current is None or current.token != self.holder.token:
            raise self._lose(self._taken(current))

    def write(self, target: Location, data: bytes) -> None:
        """Replace ``target`` (in the experiment) with ``data`` while this run holds the lock,
        else :class:`ExperimentTakenError`. Fenced exactly on a local or shared filesystem
        (staged in this run's fence directory, which a run taking over renames away first);
        on an object store, confirmed right before one PUT."""
        if self._fence is None:
            self.confirm()
            files.write_atomic(target, data)
            return
        try:
            files.write_atomic(target, data, staging=self._fence, before_rename=self.confirm)
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError) and not os.path.isdir(self._fence):
                raise self._lose(self._taken(read(self.location))) from None
            raise

    def check(self) -> None:
        """At a collective step, cheaply: raises if the lock is known lost. It reads the file
        only where the refresh is late (this process was frozen, or storage stalled), when
        another run may have taken it over; a read that fails is left to the writes, which
        confirm for themselves."""
        if self._lost is not None:
            raise self._lost
        if time.monotonic() - self._renewed <= 2 * self.every:
            return
        try:
            self.confirm()
        except ExperimentTakenError:
            raise
        except Exception as exc:  # noqa: BLE001  (any storage failure: the writes confirm)
            log.debug("could not read the experiment's lock %s: %r", self.location.display, exc)

    def _keep(self) -> None:
        """The refresh thread. It ends only once the lock is lost or released: a failure of
        any kind is retried at the next interval while the lease may still hold."""
        while not self._stop.wait(self.every):
            try:
                self._renew()
            except ExperimentTakenError:
                return
            except Exception as exc:  # noqa: BLE001  (retried; only the lease decides)
                if self._lapsed(exc):
                    return

    def _renew(self) -> None:
        current = read(self.location)
        if current is None or current.token != self.holder.token:
            raise self._lose(self._taken(current))
        began = time.monotonic()
        fresh = Holder(**{**asdict(self.holder), "refreshed_at": time.time()})
        files.write_atomic(self.location, _encode(fresh))
        self.holder, self._renewed = fresh, began

    def _lapsed(self, exc: BaseException) -> bool:
        """A refresh failed: retried while the lease may still hold; lost (True) once it may
        have expired, since another run may then take the experiment over."""
        unrefreshed = time.monotonic() - self._renewed
        if unrefreshed < self.stale_after:
            log.warning("could not refresh the experiment's lock %s (retried in %.0f s; it is "
                        "lost if refreshing fails for %.0f s more): %r", self.location.display,
                        self.every, self.stale_after - unrefreshed, exc)
            return False
        self._lose(ExperimentTakenError(lapsed(self.location.parent, self.holder.describe(),
                                               unrefreshed, self.stale_after, exc)))
        return True

    def _taken(self, found: Holder | None) -> ExperimentTakenError:
        """Another run's token (or none) was ``found`` where this run's should be."""
        other = found.describe() if found is not None and found.token else None
        return ExperimentTakenError(taken_over(
            self.location, self.holder.describe(), (self.holder.host, self.holder.pid),
            other, time.monotonic() - self._renewed, self.stale_after))

    def _lose(self, error: ExperimentTakenError) -> ExperimentTakenError:
        """Mark the lock lost (said once): every later write raises ``error``."""
        with self._losing:
            if self._lost is None:
                self._lost = error
                log.warning("rank 0 lost the lock of %s: this run writes nothing more and fails "
                            "at its next report", self.location.parent.display)
            return self._lost

    def release(self) -> None:
        """Stop refreshing and remove the lock, unless it was lost: then the file is another
        run's, or ours gone stale as a killed run's, and is left alone."""
        self._stop.set()
        self._thread.join()
        if self._lost is not None:
            log.debug("not removing %s: this run lost it", self.location.display)
            return
        try:
            current = read(self.location)
            if current is not None and current.token == self.holder.token:
                if self._fence is not None:
                    shutil.rmtree(self._fence, ignore_errors=True)
                files.delete_file(self.location, missing_ok=True)
        except HpckitError as exc:
            log.warning("could not remove the experiment's lock (the next run will find it "
                        "stale): %s", exc)


def read(location: Location) -> Holder | None:
    """The lock file's holder in one read (None where there is none; one that cannot be
    parsed as :data:`UNREADABLE`, which is no run's); a storage error as
    :class:`StorageError`. Both the fence and the runs that take a lock over read it so."""
    with files.errors_named(location, "read the lock"):
        try:
            with location.filesystem.open_input_stream(location.path) as stream:
                data = stream.read()
        except FileNotFoundError:
            return None
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError) as exc:
        log.warning("ignoring an unreadable lock %s: %s", location.display, exc)
        return UNREADABLE


def _encode(holder: Holder) -> bytes:
    return json.dumps(asdict(holder), indent=1).encode()


def _take(location: Location, me: Holder, stale: Holder) -> None:
    """Replace the dead lock ``stale`` this run read, and only it (compare and swap): a fresh
    lock that another run took over with meanwhile is put back, and this run loses."""
    if location.is_local:
        aside = f"{location.path}.stale-{me.token[:8]}"
        try:
            os.rename(location.path, aside)
        except FileNotFoundError:
            pass  # another run moved it first; the exclusive create below decides who wins
        else:
            moved = read(local_location(aside))
            if moved is not None and moved.token != stale.token:
                with contextlib.suppress(FileExistsError):  # a third run's, made meanwhile
                    os.link(aside, location.path)
                os.unlink(aside)
                _beaten(location)
            os.unlink(aside)
    _create(location, me)


def _fence_directory(location: Location, me: Holder) -> str:
    """This holder's fence directory beside the lock, made once: a write that finds it gone
    was fenced out by a run that took the lock over."""
    path = os.path.join(os.path.dirname(location.path), FENCE_PREFIX + me.token)
    with files.errors_named(location, "create the lock's fence directory"):
        os.mkdir(path)
    return path


def _fence_out(location: Location, me: Holder) -> None:
    """Once the lock file is this run's: every other run's fence directory is renamed away
    (atomically: a write staged in it either landed before or fails) and removed."""
    experiment = os.path.dirname(location.path)
    with files.errors_named(location, "fence out the runs that held the lock before"):
        for name in os.listdir(experiment):
            if not name.startswith(FENCE_PREFIX):
                continue
            aside = os.path.join(experiment, f".hpckit-fenced-{me.token[:8]}-{name[-8:]}")
            try:
                os.rename(os.path.join(experiment, name), aside)
            except FileNotFoundError:
                continue  # its run released it meanwhile
            shutil.rmtree(aside, ignore_errors=True)


def _create(location: Location, me: Holder) -> None:
    """The lock appears whole or not at all: written to a file of this run's, then linked
    under the lock's name, which fails if another run's is there."""
    data = _encode(me)
    if location.is_local:
        written = f"{location.path}.new-{me.token[:8]}"
        with files.errors_named(location, "create the lock"):
            with open(written, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(written, location.path)
            except FileExistsError:
                _beaten(location)
            finally:
                os.unlink(written)
        return
    files.write_bytes(location, data)
    time.sleep(0.2)  # let a run that wrote at the same moment land, then see who won
    current = read(location)
    if current is None or current.token != me.token:
        _beaten(location)


def _beaten(location: Location) -> NoReturn:
    """Another run took the lock at the same moment as this one, as both started: this run
    did not get it (unlike a lock that was held and then :attr:`Lock.lost`)."""
    winner = read(location)
    who = winner.describe() if winner else "another run"
    raise ExperimentLockedError(
        f"experiment {location.parent.display} was locked by {who} while this run started; "
        "two runs may not write one experiment. Choose another RunConfig(name=...).")


Me = tuple[str, int]  # this run's rank 0: host and pid


def taken_over(lock: Location, mine: str, me: Me, holder: str | None, unrefreshed: float,
               stale_after: float) -> str:
    """Another run's token (``holder``: its description; None where the ``lock`` file is gone
    or unreadable) was found where this run's should be."""
    experiment = lock.parent
    who = holder or _newest_other(experiment, me, f"its lock file {lock.display} is gone")
    why = (f"had not refreshed its lock for {unrefreshed:.0f} s (HPCKIT_LOCK_STALE_SECONDS="
           f"{stale_after:g}: was this job frozen, or cut off from its storage?)"
           if unrefreshed >= stale_after else "held the lock, which was replaced or removed")
    return (f"experiment {experiment.display} was taken over by another run ({who}) while this "
            f"run (rank 0: {mine}) {why}. {_what_now(experiment)}")


def lapsed(experiment: Location, mine: str, unrefreshed: float, stale_after: float,
           error: BaseException) -> str:
    """No refresh succeeded for the stale time: another run may take the experiment over."""
    return (f"rank 0 ({mine}) could not refresh the lock of experiment {experiment.display} for "
            f"{unrefreshed:.0f} s (HPCKIT_LOCK_STALE_SECONDS={stale_after:g}; last error: "
            f"{error!r}), so another run may have taken it over. {_what_now(experiment)}")


def _what_now(experiment: Location) -> str:
    return ("This run stopped at its next report without writing anything more, and is not "
            "restarted: the experiment belongs to the other run now (let it finish). Then run "
            f"hpckit verify {experiment.display}: a write this run had under way when it lost "
            "the lock may have landed.")


def _newest_other(experiment: Location, me: Me, gone: str) -> str:
    """The run named by the newest attempt in the manifest that is not this run's."""
    try:
        manifest = read_manifest(experiment)
    except HpckitError as exc:
        log.debug("could not read %s to name the run that took it over: %s",
                  experiment.display, exc)
        return gone
    others = [a for a in (manifest.attempts if manifest else ()) if (a.host, a.pid) != me]
    if not others:
        return gone
    last = others[-1]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.started_at))
    job = f", Slurm job {last.slurm['job_id']}" if last.slurm.get("job_id") else ""
    return (f"host {last.host}, pid {last.pid}{job}, attempt {last.attempt} started {started}, "
            f"now {last.status.value}; {gone}")
