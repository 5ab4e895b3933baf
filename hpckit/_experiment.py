"""The experiment directory: create or resume it, clean leftovers, keep metrics.jsonl."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs

from hpckit import _faults, _storage
from hpckit._log import log
from hpckit._manifest import MANIFEST_NAME, METRICS_NAME, CheckpointRecord, Manifest, is_checkpoint_dirname
from hpckit._tensorboard import Scalars
from hpckit._uri import Location
from hpckit.errors import ManifestError, StorageError

_FT = pyarrow.fs.FileType


def check_root(root: Location) -> None:
    """Refuse a storage path that is a file or cannot be created."""
    if _storage.file_type(root) == _FT.File:
        raise StorageError(
            f"storage path {root.display} is a file; storage_path must be a directory (or a "
            "bucket prefix) under which hpckit creates one directory per experiment.")


def read_manifest(experiment: Location) -> Manifest | None:
    """The experiment's manifest, None when there is none; a damaged one raises ManifestError."""
    location = experiment.join(MANIFEST_NAME)
    kind = _storage.file_type(location)
    if kind == _FT.NotFound:
        return None
    if kind != _FT.File:
        raise StorageError(f"{location.display} is not a file; move it aside and run again.")
    return Manifest.from_json(_storage.read_bytes(location), location.display)


def prepare(root: Location, name: str) -> Location:
    """The experiment directory, created: the root must be usable and the path not a file."""
    check_root(root)
    experiment = root.join(name)
    if _storage.file_type(experiment) == _FT.File:
        raise StorageError(f"experiment path {experiment.display} is a file; choose another name.")
    _storage.make_dir(experiment)
    return experiment


def preflight(root: Location, name: str) -> Manifest | None:
    """Checks that need no ranks: root usable, experiment directory creatable, manifest sane."""
    return read_manifest(prepare(root, name))


def list_experiments(root: Location) -> list[tuple[str, Manifest | None]]:
    """The experiments directly under a storage root (None for an unreadable manifest)."""
    found: list[tuple[str, Manifest | None]] = []
    for info in _storage.list_dir(root):
        if info.type != _FT.Directory:
            continue
        try:
            manifest = read_manifest(root.join(info.base_name))
        except (ManifestError, StorageError):
            found.append((info.base_name, None))
            continue
        if manifest is not None:
            found.append((info.base_name, manifest))
    return sorted(found, key=lambda item: item[0])


def write_manifest(experiment: Location, manifest: Manifest) -> None:
    _storage.write_atomic(experiment.join(MANIFEST_NAME), manifest.to_json().encode())


def end_attempt(experiment: Location, manifest: Manifest, status: str, error: str | None,
                **details: Any) -> None:
    """Record how the newest attempt ended; best-effort, since the run is ending anyway."""
    if not manifest.attempts:
        return
    manifest.attempts[-1].update(status=status, ended_at=time.time(), error=error, **details)
    try:
        write_manifest(experiment, manifest)
    except StorageError as exc:
        log.warning("could not record the attempt's end in the manifest: %s", exc)


def remove_leftovers(experiment: Location, manifest: Manifest) -> list[str]:
    """Delete checkpoint directories and temp files that no manifest names (a crashed commit's)."""
    named = {r.directory for r in manifest.checkpoints}
    removed = []
    for info in _storage.list_dir(experiment):
        leftover = (info.type == _FT.Directory and is_checkpoint_dirname(info.base_name)
                    and info.base_name not in named)
        temp = info.type == _FT.File and info.base_name.startswith(f".{MANIFEST_NAME}.tmp-")
        if not (leftover or temp):
            continue
        try:
            target = experiment.join(info.base_name)
            _storage.delete_dir(target) if leftover else _storage.delete_file(target)
            removed.append(info.base_name)
        except StorageError as exc:
            log.warning("could not remove leftover %s: %s", info.base_name, exc)
    if removed:
        log.warning("removed leftovers of an interrupted run that no manifest names: %s",
                    ", ".join(sorted(removed)))
    return removed


@dataclass
class MetricsLog:
    """metrics.jsonl: one line per report, appended (or rewritten where storage cannot append)."""

    location: Location
    lines: list[str] = field(default_factory=list)

    @classmethod
    def resume(cls, experiment: Location, next_step: int,
               latest: CheckpointRecord | None = None) -> MetricsLog:
        """Keep the lines of steps before ``next_step``: later ones describe work being redone.
        A run killed between its manifest commit and the metrics append lacks the line of
        its ``latest`` checkpoint: it is written again from the manifest."""
        location = experiment.join(METRICS_NAME)
        scalars = Scalars.open(experiment)
        raw_lines = []
        if _storage.file_type(location) != _FT.NotFound:
            raw_lines = _storage.read_bytes(location).decode(errors="replace").splitlines()
        kept, dropped, steps = [], 0, set()
        for raw in raw_lines:
            entry = _parse_line(raw)
            if entry is not None and entry.get("step", next_step) < next_step:
                kept.append(raw + "\n")
                steps.add(entry["step"])
            elif raw.strip():
                dropped += 1
        if dropped:
            log.info("metrics.jsonl: dropped %d line(s) reported after the last committed "
                     "checkpoint; those steps run again", dropped)
        restored = latest is not None and latest.step not in steps
        if latest is not None and restored:
            log.info("metrics.jsonl: restored the line of step %d from the manifest (the run "
                     "ended between committing %s and logging it)", latest.step, latest.directory)
            kept.append(_line(latest.step, latest.reported_at, latest.metrics, latest.directory))
        if dropped or restored:
            _storage.write_atomic(location, "".join(kept).encode())
        return cls(location, kept, scalars)

    scalars: Scalars | None = None

    def append(self, step: int, metrics: dict[str, Any], checkpoint: str | None) -> None:
        line = _line(step, time.time(), metrics, checkpoint)
        self.lines.append(line)
        _storage.append_text(self.location, line, lambda: "".join(self.lines))
        if self.scalars is not None:
            self.scalars.add(step, metrics)

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()


def _line(step: int, at: float, metrics: dict[str, Any], checkpoint: str | None) -> str:
    return json.dumps({"step": step, "time": at, "checkpoint": checkpoint, "metrics": metrics},
                      allow_nan=False) + "\n"


def read_metrics(experiment: Location) -> list[dict[str, Any]]:
    location = experiment.join(METRICS_NAME)
    if _storage.file_type(location) == _FT.NotFound:
        return []
    text = _storage.read_bytes(location).decode(errors="replace")
    return [e for e in map(_parse_line, text.splitlines()) if e is not None]


def _parse_line(raw: str) -> dict[str, Any] | None:
    """A metrics line, or None for a blank or torn one (a crash mid-append)."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("step"), int) else None


def evict(experiment: Location, records: list[CheckpointRecord]) -> None:
    """Delete evicted checkpoints after the commit; a failure is logged, never fatal.

    The files the manifest named go first, then the directory: a deletion cut short leaves
    a directory that no manifest names, which the next resume removes."""
    for record in records:
        started = time.perf_counter()
        target = experiment.join(record.directory)
        try:
            for f in [] if _storage.escapes(target, experiment) else record.files:
                _storage.delete_file(target.join(f.path), missing_ok=True)
                _faults.reached("evicting", 0)
            _storage.delete_dir(target)
            log.debug("retention removed %s in %.3f s", record.directory,
                      time.perf_counter() - started)
        except StorageError as exc:
            log.warning("retention could not remove %s (it is no longer in the manifest and "
                        "will be removed on resume): %s", record.directory, exc)
