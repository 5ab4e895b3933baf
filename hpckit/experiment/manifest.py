"""The manifest: the experiment's single source of truth, as an immutable value and versioned JSON.

Parsing validates every field and refuses paths that would leave the experiment directory,
so a damaged or hostile manifest can never make hpckit touch files outside it.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from hpckit.errors import ManifestError
from hpckit.experiment.attempts import Attempt, AttemptStatus
from hpckit.experiment.validation import Validation
from hpckit.experiment.validation import parse as parse_validation
from hpckit.storage.checksum import SHA256
from hpckit.storage.checksum import problem as checksum_problem

FORMAT = "hpckit.manifest"
# 2 adds cached checkpoints; 3 records each file's checksum with its algorithm ("checksum")
# where 1 and 2 had a bare SHA-256 ("sha256"). Written as 1 while there are no checkpoints.
FORMAT_VERSION = 4
MANIFEST_NAME = "manifest.json"
STAGING_NAME = ".staging"  # asynchronous checkpoints' files, waiting for the background
METRICS_NAME = "metrics.jsonl"
_DIRECTORY = re.compile(r"checkpoint_\d{6,}")
_CUSTOM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,199}")
# Directories of the experiment that are never checkpoints (artifacts/, tensorboard/ and the
# staging area), and the marker that makes a custom-named checkpoint directory a leftover
# until its commit.
LOGS = "logs"  # the hang watchdog's stacks (experiment.hangs)
RESERVED_NAMES = frozenset({"artifacts", "tensorboard", LOGS, STAGING_NAME, MANIFEST_NAME,
                            METRICS_NAME})
PENDING_MARKER = ".hpckit-pending"
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
        return (f"{name!r} is hpckit's own (its numbered checkpoints, artifacts, tensorboard, "
                "logs); choose another name, e.g. 'epoch_3'")
    return None


def is_safe_relpath(path: str) -> bool:
    """A relative POSIX path that stays inside its directory (no '..', no absolute, no empty)."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    parts = path.split("/")
    return all(p not in ("", ".", "..") for p in parts) and posixpath.normpath(path) == path


@dataclass(frozen=True)
class FileRecord:
    path: str
    size: int
    rank: int
    checksum: str  # "<algorithm>:<hex>" (hpckit.storage.checksum)


@dataclass(frozen=True)
class CheckpointRecord:
    index: int
    directory: str
    step: int
    reported_at: float
    metrics: dict[str, Any]
    files: tuple[FileRecord, ...]
    level: str = STORAGE
    hosts: tuple[str, ...] = ()  # a cached checkpoint's writers: the host of each rank
    validation: Validation | None = None  # report(..., validation=...)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def on_storage(self) -> bool:
        return self.level == STORAGE


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

    def persisted(self, directory: str) -> Manifest:
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
        of the ranks that died before rank 0 could record it)."""
        def ended(a: Attempt) -> Attempt:
            if a.status is not AttemptStatus.RUNNING:
                return a
            if previous_failure and a.pid in previous_failure[2]:
                return a.ended(previous_failure[0], previous_failure[1])
            return a.ended(AttemptStatus.INTERRUPTED)

        earlier = tuple(ended(a) for a in self.attempts)
        return replace(self, attempts=(*earlier, attempt))

    def with_last_attempt(self, attempt: Attempt) -> Manifest:
        return replace(self, attempts=(*self.attempts[:-1], attempt))

    @property
    def last_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> str:
        body = {"format": FORMAT, "format_version": self._format_version(),
                **{k: v for k, v in asdict(self).items() if k not in ("attempts", "checkpoints")},
                "checkpoints": [_checkpoint_json(r) for r in self.checkpoints],
                "attempts": [a.to_json() for a in self.attempts]}
        latest = self.latest
        body["latest"] = latest.directory if latest else None
        return json.dumps(body, indent=1, allow_nan=False) + "\n"

    def _format_version(self) -> int:
        """The oldest format that holds this manifest, so that older hpckit reads what it
        can: 1 without checkpoints, 4 with validations (which an older hpckit would drop)."""
        return 4 if any(r.validation for r in self.checkpoints) else 3 if self.checkpoints else 1

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        try:
            body = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(
                f"manifest {where} is not valid JSON ({exc}); it was left untouched. Restore it "
                "from a backup or move the experiment aside; hpckit never overwrites a corrupt "
                "manifest.") from None
        return _parse(body, where)


def _parse(body: Any, where: str) -> Manifest:
    check = _Checker(where)
    check.type(body, dict, "the top level")
    if body.get("format") != FORMAT:
        raise ManifestError(f"{where} is not an hpckit manifest (format={body.get('format')!r}).")
    version = body.get("format_version")
    check.type(version, int, "format_version")
    if version > FORMAT_VERSION:
        raise ManifestError(
            f"manifest {where} has format_version {version}, written by a newer hpckit; this "
            f"hpckit reads up to version {FORMAT_VERSION}. Upgrade hpckit (git pull in its clone).")
    checkpoints = [_parse_checkpoint(c, check, f"checkpoints[{i}]")
                   for i, c in enumerate(check.field(body, "checkpoints", list))]
    indexes = [c.index for c in checkpoints]
    if len(set(indexes)) != len(indexes):
        raise ManifestError(f"manifest {where}: checkpoints lists an index twice: {indexes}.")
    return Manifest(
        experiment=check.field(body, "experiment", str),
        world_size=check.field(body, "world_size", int),
        command=check.field(body, "command", dict),
        config=check.field(body, "config", dict),
        retention=check.field(body, "retention", dict),
        created_at=check.field(body, "created_at", (int, float)),
        checkpoints=tuple(checkpoints),
        next_checkpoint_index=check.field(body, "next_checkpoint_index", int),
        next_step=check.field(body, "next_step", int),
        attempts=tuple(Attempt.from_json(a, where) for a in check.field(body, "attempts", list)),
    )


def _parse_checkpoint(raw: Any, check: _Checker, name: str) -> CheckpointRecord:
    check.type(raw, dict, name)
    directory = check.field(raw, "directory", str, name)
    index = check.field(raw, "index", int, name)
    numbered = is_checkpoint_dirname(directory) and int(directory.split("_")[1]) == index
    if not numbered and custom_dirname_problem(directory) is not None:
        check.fail(f"{name}.directory", f"{directory!r} is not checkpoint_{index:06d} (nor a "
                   "plain directory name given by checkpoint_dir_name)")
    files = []
    for i, f in enumerate(check.field(raw, "files", list, name)):
        where = f"{name}.files[{i}]"
        check.type(f, dict, where)
        path = check.field(f, "path", str, where)
        if not is_safe_relpath(path):
            check.fail(f"{where}.path", f"{path!r} leaves the checkpoint directory")
        files.append(FileRecord(path, check.field(f, "size", int, where),
                                check.field(f, "rank", int, where), _checksum(f, check, where)))
    level = raw.get("level", STORAGE)
    if level not in (STORAGE, CACHE):
        check.fail(f"{name}.level", f"{level!r} is neither {STORAGE!r} nor {CACHE!r}")
    hosts = raw.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        check.fail(f"{name}.hosts", "expected a list of host names")
    try:
        validation = parse_validation(raw.get("validation"), f"{name}.validation")
    except ValueError as exc:
        check.fail(f"{name}.validation", str(exc))
    return CheckpointRecord(
        index=index, directory=directory, step=check.field(raw, "step", int, name),
        reported_at=check.field(raw, "reported_at", (int, float), name),
        metrics=check.field(raw, "metrics", dict, name), files=tuple(files), level=level,
        hosts=tuple(hosts), validation=validation)


def _checkpoint_json(record: CheckpointRecord) -> dict[str, Any]:
    body = {k: v for k, v in asdict(record).items() if k != "validation"}
    return {**body, "validation": record.validation.to_json()} if record.validation else body


def _checksum(raw: dict[str, Any], check: _Checker, where: str) -> str:
    if "checksum" not in raw and "sha256" in raw:  # format versions 1 and 2
        return f"{SHA256}:{check.field(raw, 'sha256', str, where)}"
    value: str = check.field(raw, "checksum", str, where)
    if (why := checksum_problem(value)) is not None:
        check.fail(f"{where}.checksum", why)
    return value


_Kind = type | tuple[type, ...]


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, name: str, problem: str) -> None:
        raise ManifestError(f"manifest {self.where}: field {name}: {problem}.")

    def type(self, value: Any, kind: _Kind, name: str) -> None:
        if isinstance(value, bool) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(name, f"expected {expected}, got {type(value).__name__}")

    def field(self, body: dict[str, Any], key: str, kind: _Kind,
              parent: str = "") -> Any:
        name = f"{parent}.{key}" if parent else key
        if key not in body:
            self.fail(name, "missing")
        self.type(body[key], kind, name)
        return body[key]
