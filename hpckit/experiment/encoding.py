"""The manifest's JSON, both ways, and the rules of its versions: written as the oldest
version that holds it (:func:`to_json`), read back into its values with every field checked
(:func:`from_json`).

A damaged or hostile manifest fails here with the field it got wrong, and a path that would
leave the experiment directory is refused, so that reading a manifest can never make hpckit
touch files outside it. Formats 1 to 8 are read; a newer one is refused with the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from hpckit.errors import ManifestError
from hpckit.experiment.attempts import Attempt
from hpckit.experiment.manifest import (
    CACHE,
    STORAGE,
    CheckpointRecord,
    FileRecord,
    Manifest,
    custom_dirname_problem,
    is_checkpoint_dirname,
    is_safe_relpath,
)
from hpckit.experiment.manifest import parse as parse_validation
from hpckit.experiment.records import KeptApart, RecordsFile, parse_reference
from hpckit.storage.copy import SHA256
from hpckit.storage.copy import problem as checksum_problem

FORMAT = "hpckit.manifest"
# 2 adds cached checkpoints; 3 records each file's checksum with its algorithm ("checksum")
# where 1 and 2 had a bare SHA-256 ("sha256"); 4 adds validations; 5 keeps the records of a
# checkpoint of many files in a file of their own (experiment.records); 6 allows a file whose
# writer is not known; 7 records the experiment's tracker runs; 8 keeps a checkpoint's records
# in parts, one per node, that an index names (experiment.records). Each manifest is written as
# the oldest version that holds it: 1 while there are no checkpoints. An attempt's optional
# fields (``resumed_from`` among them) need no version: every reader skips what it does not know.
FORMAT_VERSION = 8


def to_json(manifest: Manifest) -> str:
    """The manifest as the JSON written to ``manifest.json``."""
    body = {"format": FORMAT, "format_version": _version(manifest),
            **{f.name: getattr(manifest, f.name) for f in fields(manifest)
               if f.name not in ("attempts", "checkpoints")},
            "checkpoints": [checkpoint_json(r) for r in manifest.checkpoints],
            "attempts": [a.to_json() for a in manifest.attempts]}
    latest = manifest.latest
    body["latest"] = latest.directory if latest else None
    return json.dumps(body, indent=1, allow_nan=False) + "\n"


def _version(manifest: Manifest) -> int:
    """The oldest format that holds this manifest, so that older hpckit reads what it
    can: 1 without checkpoints, 4 with validations (which an older hpckit would drop), 5
    with records kept apart (which it could not find), 6 with a file whose writer is not
    known (which it would take for a damaged record), 7 with tracker runs (which it
    would drop, and a resume would start new runs), 8 with records in parts (which it would
    take for damaged records)."""
    if any(r.records and r.records.parts for r in manifest.checkpoints):
        return 8
    if manifest.tracker_runs:
        return 7
    if not all(r.writers_known for r in manifest.checkpoints):
        return 6
    if any(r.records for r in manifest.checkpoints):
        return 5
    if any(r.validation for r in manifest.checkpoints):
        return 4
    return 3 if manifest.checkpoints else 1


def checkpoint_json(record: CheckpointRecord, inline: bool = False) -> dict[str, Any]:
    """A checkpoint's JSON: its files' records, or where they are kept apart a reference to
    them (with ``inline``, both)."""
    body: dict[str, Any] = {}
    for name in (f.name for f in fields(record)):
        value = getattr(record, name)
        if name == "files" and (inline or record.records is None):
            body["files"] = [f._asdict() for f in value]
        if name == "files" and record.records is not None:
            body["records"] = record.records.to_json()
        elif name == "validation" and value is not None:
            body["validation"] = value.to_json()
        elif name not in ("files", "validation", "records"):
            body[name] = list(value) if name == "hosts" else value
    return body


def from_json(text: str | bytes, where: str,
              read: Callable[[str], bytes] | None = None) -> Manifest:
    """The manifest ``text`` (read from ``where``); ``read`` reads a file of the experiment by
    its relative name, for the records a format 5 manifest keeps apart."""
    try:
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(
            f"manifest {where} is not valid JSON ({exc}); it was left untouched. Restore it "
            "from a backup or move the experiment aside; hpckit never overwrites a corrupt "
            "manifest.") from None
    return parse(body, where, read)


def parse(body: Any, where: str, read: Callable[[str], bytes] | None) -> Manifest:
    check = _Checker(where, read)
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
        # Never an index a committed checkpoint has, whatever the file says (edited by hand):
        # a resume would write its next checkpoint over that one.
        next_checkpoint_index=max([check.field(body, "next_checkpoint_index", int),
                                   *(index + 1 for index in indexes)]),
        next_step=check.field(body, "next_step", int),
        attempts=tuple(Attempt.from_json(a, where) for a in check.field(body, "attempts", list)),
        tracker_runs=_tracker_runs(body, check),
    )


def _tracker_runs(body: dict[str, Any], check: _Checker) -> dict[str, str]:
    runs = check.field(body, "tracker_runs", dict) if "tracker_runs" in body else {}
    for tracker, run_id in runs.items():
        check.type(run_id, str, f"tracker_runs.{tracker}")
    return dict(runs)


def _parse_checkpoint(raw: Any, check: _Checker, name: str) -> CheckpointRecord:
    check.type(raw, dict, name)
    directory = check.field(raw, "directory", str, name)
    index = check.field(raw, "index", int, name)
    numbered = is_checkpoint_dirname(directory) and int(directory.split("_")[1]) == index
    if not numbered and custom_dirname_problem(directory) is not None:
        check.fail(f"{name}.directory", f"{directory!r} is not checkpoint_{index:06d} (nor a "
                   "plain directory name given by checkpoint_dir_name)")
    records = (parse_reference(raw["records"], index, f"{check.where}: {name}.records")
               if "records" in raw else None)
    files = _kept_apart(records, check) if records else _inline_files(raw, check, name)
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
        metrics=check.field(raw, "metrics", dict, name), files=files, level=level,
        hosts=tuple(hosts), validation=validation, records=records)


def _kept_apart(records: RecordsFile, check: _Checker) -> KeptApart:
    """A checkpoint's records in their own file, read when first asked for."""
    if check.read is None:
        raise ManifestError(f"manifest {check.where} keeps records in {records.name}, and "
                            "nothing was given to read it with (a bug in hpckit: please report it).")
    return KeptApart(records, check.read, check.where, is_safe_relpath)


def _inline_files(raw: dict[str, Any], check: _Checker, name: str) -> tuple[FileRecord, ...]:
    """A checkpoint's file records as the manifest itself holds them."""
    files = []
    for i, f in enumerate(check.field(raw, "files", list, name)):
        where = f"{name}.files[{i}]"
        check.type(f, dict, where)
        path = check.field(f, "path", str, where)
        if not is_safe_relpath(path):
            check.fail(f"{where}.path", f"{path!r} leaves the checkpoint directory")
        files.append(FileRecord(path, check.field(f, "size", int, where),
                                check.field(f, "rank", (int, type(None)), where),
                                _checksum(f, check, where)))
    return tuple(files)


def _checksum(raw: dict[str, Any], check: _Checker, where: str) -> str:
    if "checksum" not in raw and "sha256" in raw:  # format versions 1 and 2
        return f"{SHA256}:{check.field(raw, 'sha256', str, where)}"
    value: str = check.field(raw, "checksum", str, where)
    if (why := checksum_problem(value)) is not None:
        check.fail(f"{where}.checksum", why)
    return value


_Kind = type | tuple[type, ...]


class _Checker:
    def __init__(self, where: str, read: Callable[[str], bytes] | None = None) -> None:
        self.where = where
        self.read = read

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
