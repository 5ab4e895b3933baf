"""Artifacts: files a rank writes beside its checkpoints (plots, samples, logs), kept in a
node-local directory and persisted to ``{experiment}/artifacts/rank-N/`` at every report.

Only files that changed since they were last sent (size or modification time) are sent
again. A failed upload is logged and retried at the next report: artifacts never fail
training. The local directory is synced once more and removed when the attempt ends.

Where the hang watchdog (:mod:`hpckit.run.ending.hang`) keeps a hung rank's stacks, and how a
later run tells that the attempt before it hung although nobody could record it: under
``srun`` or ``mpirun`` every rank ends, rank 0 included, and no launcher of hpckit's saw it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hpckit.errors import StorageError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.manifest import LOGS, Manifest
from hpckit.logs import log
from hpckit.storage import files
from hpckit.storage.copy import persist_file
from hpckit.storage.location import Location

DIRECTORY = "artifacts"


class Artifacts:
    def __init__(self, experiment: Location, rank: int, local_dir: str | None, sync: bool) -> None:
        self.target = experiment.join(DIRECTORY, f"rank-{rank}")
        self.rank = rank
        self.local_dir = local_dir
        self.enabled = sync
        self._directory: str | None = None
        self._sent: dict[str, tuple[int, int]] = {}

    @property
    def directory(self) -> str:
        """This rank's local artifact directory, created on first use."""
        if self._directory is None:
            base = os.path.join(self.local_dir or tempfile.gettempdir(), "hpckit-artifacts")
            os.makedirs(base, exist_ok=True)
            self._directory = tempfile.mkdtemp(prefix=f"rank-{self.rank}-", dir=base)
        return self._directory

    def sync(self) -> int:
        """Send what changed; returns the number of files sent."""
        if not self.enabled or self._directory is None:
            return 0
        sent = 0
        for parent, _, names in os.walk(self._directory):
            for name in sorted(names):
                full = os.path.join(parent, name)
                rel = os.path.relpath(full, self._directory).replace(os.sep, "/")
                try:
                    stat = os.stat(full)
                except FileNotFoundError:
                    continue  # removed while we looked
                stamp = (stat.st_size, stat.st_mtime_ns)
                if self._sent.get(rel) == stamp:
                    continue
                try:
                    persist_file(full, self.target.join(rel))
                except StorageError as exc:
                    log.warning("rank %d: could not persist artifact %s (retried at the next "
                                "report): %s", self.rank, rel, exc)
                    continue
                self._sent[rel] = stamp
                sent += 1
        return sent

    def close(self, sync: bool = True) -> None:
        """The last sync (not for a run whose experiment another run took), then the local
        directory removed."""
        if sync:
            self.sync()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


HUNG = ("hung: no report() completed within FailureConfig(hang_timeout_s); every rank's "
        f"stacks are in the experiment's {LOGS}/")


def _stem(attempt: int) -> str:
    return f"hang-attempt{attempt}-rank"


def stacks_name(attempt: int, rank: int) -> str:
    return f"{LOGS}/{_stem(attempt)}{rank}.txt"


def keep_stacks(target: Location, stacks: bytes) -> None:
    """A hung rank's stacks, at ``target`` (:func:`stacks_name`): each rank writes its own,
    as it has no :class:`~hpckit.experiment.experiment.Experiment` (rank 0 holds the only one)."""
    files.make_dir(target.parent)
    files.write_bytes(target, stacks)


def hung_unrecorded(location: Location,
                    manifest: Manifest) -> tuple[AttemptStatus, str, frozenset[int]] | None:
    """The last attempt, still marked running, as hung where its ranks left their stacks."""
    last = manifest.last_attempt
    if last is None or last.status is not AttemptStatus.RUNNING or last.pid is None:
        return None
    names = [info.base_name for info in files.list_dir(location.join(LOGS))]
    if not any(name.startswith(_stem(last.attempt)) for name in names):
        return None
    return AttemptStatus.HUNG, HUNG, frozenset({last.pid})
