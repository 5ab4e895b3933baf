"""What a run brings to the experiment it opens, and the experiment directory and manifest
made ready for it: created on first use; on resume, links out of it, damaged checkpoints and
cached ones this run cannot read dropped, and this run's configuration recorded; then the
opening itself (`begin`): locked, read once the lock is ours, the new attempt recorded.

Whether a checkpoint can be resumed by another number of ranks (``hpckit resume -n``).

Files that rank 0 alone wrote are read the same by any world. Torch DCP's files (a
``.metadata`` beside its ``.distcp`` shards) are resharded by ``load_state_dcp`` to the world
that loads them. The ranks' resume states are left behind at another world size (the
ranks' random streams and loader positions start afresh). Per-rank shards of any other kind
belong to the ranks that wrote them, and a file written in place by one of several ranks
(its record's rank ``None``) may be one.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import pyarrow.fs

from hpckit.config.callbacks import TrackedExperiment, TrackerCallback
from hpckit.errors import StorageError
from hpckit.experiment import verify
from hpckit.experiment.artifacts import hung_unrecorded
from hpckit.experiment.attempts import Attempt, AttemptStatus
from hpckit.experiment.leftovers import put_back_handed, remove_leftovers
from hpckit.experiment.lock import Lock
from hpckit.experiment.manifest import CheckpointRecord, FileRecord, Manifest, is_rank_state
from hpckit.experiment.metrics import MetricsLog
from hpckit.experiment.reading import check_root, parse_line, read_log, read_manifest
from hpckit.experiment.tensorboard import Scalars
from hpckit.experiment.tracking import Trackers
from hpckit.logs import log
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location

_FT = pyarrow.fs.FileType


@dataclass(frozen=True)
class Opening:
    """What a run brings to the experiment it opens. ``started``: the manifest it starts
    where the experiment has none; a resume records its world size, command, configuration
    and retention (:meth:`Manifest.resumed_by`)."""

    started: Manifest
    verify_on_resume: bool
    attempt: Attempt
    # How the attempt before ended (failed or hung), as its launcher saw it, and its ranks' PIDs.
    previous_failure: tuple[AttemptStatus, str, frozenset[int]] | None = None
    restored: str | None = None  # the cached checkpoint the ranks assembled (run.restore)
    trackers: tuple[TrackerCallback, ...] = ()  # RunConfig(callbacks=...)'s, and what they are told
    tracked: TrackedExperiment | None = None

    @property
    def name(self) -> str:
        return self.started.experiment


def prepare(root: Location, name: str) -> Location:
    """The experiment directory, created: the root must be usable and the path not a file."""
    check_root(root)
    experiment = root.join(name)
    if files.file_type(experiment) == _FT.File:
        raise StorageError(f"experiment path {experiment.display} is a file; choose another name.")
    files.make_dir(experiment)
    return experiment


def numbered(opening: Opening, manifest: Manifest, found: Manifest | None) -> Attempt:
    """This run's attempt, numbered across every run of the experiment (not per run), with
    its configuration when that differs from the attempt before, and the checkpoint it
    resumes from."""
    config = opening.started.config
    changed = found is None or found.config != config or not found.attempts
    latest = manifest.latest if found is not None else None
    return replace(opening.attempt, attempt=len(manifest.attempts),
                   config=config if changed else None,
                   resumed_from=latest.directory if latest else None)


def resumable(location: Location, manifest: Manifest, opening: Opening) -> Manifest:
    """The manifest of a run being resumed: links out of it and damaged checkpoints dropped,
    this run's retention, world size, command and configuration recorded (``hpckit resume``
    repeats the latest)."""
    manifest = manifest.without(verify.escaping(location, manifest))
    manifest = manifest.without(_unservable(manifest, opening.restored))
    if opening.verify_on_resume:
        manifest = manifest.without(verify.damaged(location, manifest))
    latest = manifest.latest
    if manifest.world_size != opening.started.world_size:
        log.warning("resuming %s with %d ranks; it was recorded with %d", opening.name,
                    opening.started.world_size, manifest.world_size)
    log.info("resuming experiment %s from %s", location.display,
             latest.directory if latest else "its start (no checkpoint was committed)")
    return manifest.resumed_by(opening.started)


def _unservable(manifest: Manifest, restored: str | None) -> list[CheckpointRecord]:
    """Cached checkpoints newer than what this run restarts from: no node of it holds them."""
    floor = max((r.index for r in manifest.checkpoints if r.on_storage or r.directory == restored),
                default=-1)
    gone = [r for r in manifest.checkpoints if not r.on_storage and r.index > floor]
    if gone:
        log.warning("dropped %s from the manifest: in node-local caches that this run cannot "
                    "read (no cache_dir, or other nodes); the run repeats their work",
                    ", ".join(r.directory for r in gone))
    return gone


def _trackers(location: Location, manifest: Manifest, opening: Opening,
              raw_lines: list[str]) -> Trackers:
    """The experiment's tracker runs, opened again where the manifest records them, and its
    TensorBoard events (told on resume that the steps from ``next_step`` are done again)."""
    tracked = opening.tracked or TrackedExperiment(opening.name, location.display)
    scalars = Scalars.open(location)
    if scalars is not None and raw_lines:
        scalars.restart(manifest.next_step)
    committed = [line for line in map(parse_line, raw_lines)
                 if line is not None and line["step"] < manifest.next_step]
    return Trackers.open(opening.trackers, manifest.tracker_runs, tracked, scalars, committed)


def begin(root: Location, opening: Opening, settings: Settings,
          write: Callable[[Location, Manifest], None]) -> tuple[Location, Lock, Manifest, MetricsLog]:
    """Lock the experiment, read its manifest once the lock is ours (or start one), record
    the new attempt with ``write``, remove the leftovers and resume the metrics log; the lock
    is released again if any of it fails."""
    location = prepare(root, opening.name)
    lock = Lock.acquire(location, settings)
    try:
        found = read_manifest(location)
        if found is None:
            manifest = replace(opening.started, created_at=time.time())
        else:
            manifest = resumable(location, found, opening)
        manifest = manifest.with_attempt(
            numbered(opening, manifest, found),
            opening.previous_failure or hung_unrecorded(location, manifest))
        raw_lines = read_log(location)
        trackers = _trackers(location, manifest, opening, raw_lines)
        manifest = replace(manifest, tracker_runs={**manifest.tracker_runs, **trackers.run_ids})
        write(location, manifest)
        if found is not None:
            put_back_handed(location, found)
            remove_leftovers(location, manifest)
        return location, lock, manifest, MetricsLog.resume(location, manifest.next_step,
                                                           manifest.latest, raw_lines, trackers)
    except BaseException:
        lock.release()
        raise


DCP_METADATA = ".metadata"
DCP_SHARD = ".distcp"


def dcp_directories(record: CheckpointRecord) -> set[str]:
    """The directories of ``record`` that hold a DCP checkpoint ("" for its root)."""
    return {posixpath.dirname(f.path) for f in record.files
            if posixpath.basename(f.path) == DCP_METADATA}


def _dcp_file(f: FileRecord, dcp: set[str]) -> bool:
    name = posixpath.basename(f.path)
    return posixpath.dirname(f.path) in dcp and (name == DCP_METADATA or name.endswith(DCP_SHARD))


def resize_refusal(record: CheckpointRecord | None, recorded: int, ranks: int,
            asked: str | None = None, keep: str | None = None) -> str | None:
    """Why ``record`` cannot be resumed by ``ranks`` ranks instead of ``recorded``; None
    where it can. ``asked``: what asked for ``ranks`` (``hpckit resume -n``'s flag by
    default); ``keep``: how to keep the recorded world instead."""
    if record is None or ranks == recorded:
        return None
    dcp = dcp_directories(record)
    others = [f for f in record.files if not _dcp_file(f, dcp) and not is_rank_state(f.path)]
    unknown = sorted(f.path for f in others if f.rank is None)
    shards = sorted({f.rank for f in others if f.rank is not None and f.rank != 0})
    if not shards and not unknown:
        return None
    differs = f"{asked or f'-n {ranks}'} differs from the recorded world size {recorded}, but "
    fix = (f"{keep or f'Use -n {recorded}'}; or save the state with "
           "hpckit.torch.save_state_dcp, whose checkpoints load at any world size.")
    if shards:
        writers = sorted({f.rank for f in record.files if f.rank is not None})
        more = f" (and {len(unknown)} whose writer is not known)" if unknown else ""
        return (f"{differs}{record.directory} holds files written by ranks {writers}{more}: "
                f"per-rank shards need the same world size. {fix}")
    named = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    return (f"{differs}{record.directory} holds files written in place by ranks that all handed "
            f"get_checkpoint_dir() ({named}): hpckit cannot tell which rank wrote them, so they "
            f"may be per-rank shards. {fix} Where rank 0 alone writes a checkpoint in place, "
            "report checkpoint=None on the other ranks, and it resumes at any size.")
