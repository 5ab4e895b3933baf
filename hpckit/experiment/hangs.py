"""Where the hang watchdog (:mod:`hpckit.run.ending.hang`) keeps a hung rank's stacks, and how a
later run tells that the attempt before it hung although nobody could record it: under
``srun`` or ``mpirun`` every rank ends, rank 0 included, and no launcher of hpckit's saw it."""

from __future__ import annotations

from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.manifest import LOGS, Manifest
from hpckit.storage import files
from hpckit.storage.location import Location

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
