"""The manifest: the experiment's single source of truth, as an immutable value. Its JSON,
written and read back and the rules of its versions, is :mod:`~hpckit.experiment.encoding`'s;
the records of a checkpoint of many files are kept in a file of their own
(:mod:`~hpckit.experiment.records`).

A checkpoint's validation as the manifest records it: what was asked (the function's
keyword arguments and time limit, so that a resumed run validates alike) and where it stands
(pending, validated with its metrics, failed or timed out, with the reason).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from hpckit.experiment.attempts import Attempt, AttemptStatus
from hpckit.experiment.records import PARTS_DIR, RECORDS_DIR, KeptApart, RecordsFile
from hpckit.experiment.records import FileRecord as FileRecord

MANIFEST_NAME = "manifest.json"  # the experiment's one source of truth, beside its checkpoints
STAGING_NAME = ".staging"  # asynchronous checkpoints' files, waiting for the background
METRICS_NAME = "metrics.jsonl"
SWEEP_NAME = "sweep.json"  # beside its trials' experiments: the sweep manifest (sweep.record)
_DIRECTORY = re.compile(r"checkpoint_\d{6,}")
_CUSTOM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,199}")
# Directories of the experiment that are never checkpoints (artifacts/, tensorboard/ and the
# staging area), and the marker that makes a custom-named checkpoint directory a leftover
# until its commit.
LOGS = "logs"  # the hang watchdog's stacks (experiment.hangs)
RESERVED_NAMES = frozenset({"artifacts", "tensorboard", LOGS, RECORDS_DIR, STAGING_NAME,
                            MANIFEST_NAME, METRICS_NAME})
PENDING_MARKER = ".hpckit-pending"
RANK_STATE_DIR = ".hpckit-resume"  # in a checkpoint: each rank's resume state (run.writing.rankstate)
VISIBLE_PREFIX = ".hpckit-visible-"  # a run's check that every rank sees the experiment
# Where a committed checkpoint is complete: on storage_path, or only in the node-local caches
# of the nodes named by its hosts (CheckpointConfig(cache_dir), docs/multilevel.md).
STORAGE, CACHE = "storage", "cache"


def checkpoint_dirname(index: int) -> str:
    return f"checkpoint_{index:06d}"


def is_checkpoint_dirname(name: str) -> bool:
    return bool(_DIRECTORY.fullmatch(name))


def custom_dirname_problem(name: str) -> str | None:
    """Why ``name`` cannot name a checkpoint directory (``report(checkpoint_dir_name=...)``),
    or None when it can."""
    if not isinstance(name, str) or not _CUSTOM.fullmatch(name):
        return ("use one directory name of letters, digits and . _ = + - (not starting with a "
                "dot or a dash, at most 200 characters), e.g. 'checkpoint_epoch_3'")
    if name in RESERVED_NAMES or is_checkpoint_dirname(name):
        return (f"{name!r} is hpckit's own (its numbered checkpoints, "
                f"{', '.join(sorted(RESERVED_NAMES))}); choose another name, e.g. 'epoch_3'")
    return None


def is_records_part(name: str) -> bool:
    """Whether a checkpoint's relative file name is a node's part of its records (format 8):
    hpckit's, and never one of the checkpoint's files."""
    return name == PARTS_DIR or name.startswith(PARTS_DIR + "/")


def is_rank_state(name: str) -> bool:
    """Whether a checkpoint's relative file name is a rank's resume state: hpckit's, read by
    the rank that wrote it alone, and left behind at another world size."""
    return name == RANK_STATE_DIR or name.startswith(RANK_STATE_DIR + "/")


def is_safe_relpath(path: str) -> bool:
    """A relative POSIX path that stays inside its directory (no '..', no absolute, no empty)."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    parts = path.split("/")
    return all(p not in ("", ".", "..") for p in parts) and posixpath.normpath(path) == path


@dataclass(frozen=True)
class CheckpointRecord:
    index: int
    directory: str
    step: int
    reported_at: float
    metrics: dict[str, Any]
    files: Sequence[FileRecord]  # a tuple, or (kept apart) a KeptApart, read on first use
    level: str = STORAGE
    hosts: tuple[str, ...] = ()  # a cached checkpoint's writers: the host of each rank
    validation: Validation | None = None  # report(..., validation=...)
    records: RecordsFile | None = None  # where ``files`` are kept, when not in the manifest

    @property
    def damaged(self) -> str | None:
        """Why ``files`` could not be read back from ``records`` (a damaged record file): this
        checkpoint cannot be verified, resumed from or exported; the others are unaffected.
        Never written: the manifest keeps the reference as it was."""
        return self.files.problem if isinstance(self.files, KeptApart) else None

    def read(self) -> CheckpointRecord:
        """This record with its files read now, where they are kept apart (else on first
        use): before it is sent to the other ranks, which would each read them again."""
        len(self.files)
        return self

    def file(self, path: str, rank: int | None = None) -> FileRecord | None:
        """The record of file ``path``, reading as few of its records as it can (``rank``:
        the one asking, whose node's part of the records is read first)."""
        if isinstance(self.files, KeptApart):
            return self.files.find(path, rank)
        return next((f for f in self.files if f.path == path), None)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def on_storage(self) -> bool:
        return self.level == STORAGE

    @cached_property
    def writers_known(self) -> bool:
        """Whether every file's writer is recorded: looked at once per record, not at every
        rewrite of the manifest that keeps it."""
        return all(f.rank is not None for f in self.files)


@dataclass(frozen=True)
class Manifest:
    """The experiment's state as one immutable value: every change makes a new manifest, and
    only :class:`hpckit.experiment.Experiment` writes one."""

    experiment: str
    world_size: int
    command: dict[str, Any]
    config: dict[str, Any]
    retention: dict[str, Any]
    created_at: float
    checkpoints: tuple[CheckpointRecord, ...] = ()
    next_checkpoint_index: int = 0
    next_step: int = 0
    attempts: tuple[Attempt, ...] = ()
    # The experiment's run in each tracker (MLflow, W&B), by tracker: a resume opens them again.
    tracker_runs: dict[str, str] = field(default_factory=dict)

    def resumed_by(self, run: Manifest) -> Manifest:
        """This manifest as ``run`` (the manifest a resuming run would start) resumes it:
        from the step after the latest checkpoint, with the run's world size, command,
        configuration and retention."""
        latest = self.latest
        return replace(self, next_step=latest.step + 1 if latest else 0,
                       world_size=run.world_size, command=run.command, config=run.config,
                       retention=run.retention)

    @property
    def latest(self) -> CheckpointRecord | None:
        return max(self.checkpoints, key=lambda r: r.index, default=None)

    def with_checkpoint(self, record: CheckpointRecord,
                        evicted: Iterable[CheckpointRecord] = ()) -> Manifest:
        """The manifest after committing ``record`` and dropping what retention evicts."""
        gone = {r.index for r in evicted}
        kept = tuple(r for r in (*self.checkpoints, record) if r.index not in gone)
        return replace(self, checkpoints=kept, next_checkpoint_index=record.index + 1,
                       next_step=record.step + 1)

    def validated(self, directory: str, validation: Validation) -> Manifest:
        """The manifest with ``directory``'s validation replaced; a validation's metrics are
        merged into the checkpoint's own (they win over same-named ones, as in Ray)."""
        return replace(self, checkpoints=tuple(
            replace(r, validation=validation, metrics={**r.metrics, **(validation.metrics or {})})
            if r.directory == directory else r for r in self.checkpoints))

    @property
    def awaiting_validation(self) -> tuple[CheckpointRecord, ...]:
        """The kept checkpoints whose validation has not ended, oldest first."""
        return tuple(r for r in self.checkpoints if r.validation and r.validation.pending)

    def reached_storage(self, directory: str) -> Manifest:
        """The manifest once the cached checkpoint ``directory`` is on storage_path too."""
        return replace(self, checkpoints=tuple(
            replace(r, level=STORAGE, hosts=()) if r.directory == directory else r
            for r in self.checkpoints))

    def without(self, records: Iterable[CheckpointRecord]) -> Manifest:
        gone = {r.index for r in records}
        return replace(self, checkpoints=tuple(r for r in self.checkpoints if r.index not in gone))

    def with_attempt(self, attempt: Attempt,
                     previous_failure: tuple[AttemptStatus, str, frozenset[int]] | None = None,
                     ) -> Manifest:
        """A new attempt begins: earlier ones still marked running were interrupted, or
        failed (or hung) as their launcher saw (``previous_failure``: how, why, and the PIDs
        of the ranks that died before rank 0 could record it; none known: any left running)."""
        def ended(a: Attempt) -> Attempt:
            if a.status is not AttemptStatus.RUNNING:
                return a
            if previous_failure and (a.pid in previous_failure[2] or not previous_failure[2]):
                return a.ended(previous_failure[0], previous_failure[1])
            return a.ended(AttemptStatus.INTERRUPTED)

        earlier = tuple(ended(a) for a in self.attempts)
        return replace(self, attempts=(*earlier, attempt))

    def with_last_attempt(self, attempt: Attempt) -> Manifest:
        return replace(self, attempts=(*self.attempts[:-1], attempt))

    @property
    def last_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


PENDING, VALIDATED = "PENDING_VALIDATION", "VALIDATED"
FAILED, TIMED_OUT = "VALIDATION_FAILED", "VALIDATION_TIMEOUT"
STATUSES = (PENDING, VALIDATED, FAILED, TIMED_OUT)


@dataclass(frozen=True)
class Validation:
    status: str
    fn_kwargs: dict[str, Any]
    timeout_s: float | None = None
    metrics: dict[str, Any] | None = None  # what the validation function returned
    error: str | None = None  # why it failed or timed out

    @classmethod
    def asked(cls, task: dict[str, Any]) -> Validation:
        """Pending, with the arguments of ``ValidationConfig.task()``."""
        return cls(PENDING, dict(task["fn_kwargs"]), task["timeout_s"])

    @property
    def pending(self) -> bool:
        return self.status == PENDING

    def ended(self, status: str, metrics: dict[str, Any] | None = None,
              error: str | None = None) -> Validation:
        return replace(self, status=status, metrics=metrics, error=error)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def parse(raw: Any, where: str) -> Validation | None:
    """A manifest's ``validation`` field (None: none asked); raises ValueError naming what
    is wrong."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object")
    status, kwargs = raw.get("status"), raw.get("fn_kwargs", {})
    if status not in STATUSES:
        raise ValueError(f"{where}.status: {status!r} is none of {', '.join(STATUSES)}")
    if not isinstance(kwargs, dict):
        raise ValueError(f"{where}.fn_kwargs: expected an object")
    timeout, metrics, error = raw.get("timeout_s"), raw.get("metrics"), raw.get("error")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise ValueError(f"{where}.timeout_s: expected a number")
    if metrics is not None and not isinstance(metrics, dict):
        raise ValueError(f"{where}.metrics: expected an object")
    if error is not None and not isinstance(error, str):
        raise ValueError(f"{where}.error: expected a string")
    return Validation(status, kwargs, timeout, metrics, error)
