"""A checkpoint's file records, and the file of their own that holds them beyond a threshold.

A checkpoint of a thousand ranks with two files each has 2,000 records. Kept inline, every
later change of the manifest (the next commit, a validation, the end of an attempt) would
render and rewrite all of them again. Manifest format 5 moves the records of a checkpoint
of more files than ``HPCKIT_INLINE_RECORDS`` (1,000) into ``records/<index>.json``, written
once, before the commit, by the experiment's owner; the manifest keeps the file's name,
checksum and record count. A record file is never changed after it is written, and it is read back only
when its checksum matches the manifest's.

Format 8: where the node leaders merged their ranks' records (``run.writing.writer.node_part``),
each wrote its node's part into the checkpoint, ``<checkpoint>/.hpckit-records/rank-N.json``
(N: the leader's rank), and the record file is an index of the parts, each with its checksum
and count: rank 0 writes one line per node, whatever the ranks. A part lives and goes with its
checkpoint's directory (a leftover's parts go with the leftover).

Either form is read when first asked for, not with the manifest (``experiment.kept``).

A checkpoint's records that its manifest keeps apart (formats 5 and 8,
``experiment.records``), read on first use rather than with the manifest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, overload

from hpckit import settings
from hpckit.errors import ManifestError, StorageError
from hpckit.storage.copy import checksum_of
from hpckit.storage.copy import problem as checksum_problem

RECORDS_DIR = "records"
RECORDS_FORMAT = "hpckit.records"
PARTS_DIR = ".hpckit-records"  # in a checkpoint: the parts of its records, one per node


class FileRecord(NamedTuple):
    """One file of a checkpoint. A tuple, not a dataclass: a commit at 10,000 ranks makes,
    sends and renders tens of thousands of them, and a tuple is made and read back from a
    pickle several times faster."""

    path: str
    size: int
    rank: int | None  # that wrote it; None: one of several that handed an in-place directory
    checksum: str  # "<algorithm>:<hex>" (hpckit.storage.copy)


@dataclass(frozen=True)
class RecordsFile:
    """Where a checkpoint's records are kept when the manifest does not hold them: the file
    (relative to the experiment), its checksum, and how many records it holds."""

    name: str
    checksum: str
    count: int
    parts: int = 0  # the file indexes this many parts, one per node (format 8); 0: none

    def to_json(self) -> dict[str, Any]:
        body = {"file": self.name, "checksum": self.checksum, "count": self.count}
        return {**body, "parts": self.parts} if self.parts else body


class Part(NamedTuple):
    """One node's part of a checkpoint's records, as its index names it."""

    name: str  # relative to the experiment: <checkpoint>/.hpckit-records/rank-N.json
    checksum: str
    records: int  # how many it holds


def part_name(directory: str, leader: int) -> str:
    """The part that the node led by rank ``leader`` writes of checkpoint ``directory``."""
    return f"{directory}/{PARTS_DIR}/rank-{leader:06d}.json"


def indexed(directory: str, index: int, parts: Sequence[Part]) -> tuple[RecordsFile, bytes]:
    """The reference a manifest keeps and the bytes to write for an index of ``parts``."""
    body = {"format": RECORDS_FORMAT, "directory": directory, "parts": [list(p) for p in parts]}
    data = (json.dumps(body, separators=(",", ":"), allow_nan=False) + "\n").encode()
    return RecordsFile(records_name(index), checksum_of(data), sum(p.records for p in parts),
                       len(parts)), data


def records_name(index: int) -> str:
    """The record file of checkpoint ``index``: indexes are never reused, so neither is it."""
    return f"{RECORDS_DIR}/{index:06d}.json"


def filed_apart(files: Sequence[FileRecord]) -> bool:
    """Whether a checkpoint's records go into a file of their own."""
    return len(files) > settings.current().inline_records


def render_records(directory: str, files: Sequence[FileRecord]) -> bytes:
    """A record file's bytes: one compact array per file, in the manifest's order."""
    body = {"format": RECORDS_FORMAT, "directory": directory, "files": files}
    return (json.dumps(body, separators=(",", ":"), allow_nan=False) + "\n").encode()


def filed(directory: str, index: int, files: Sequence[FileRecord]) -> tuple[RecordsFile, bytes]:
    """The reference a manifest keeps and the bytes to write for a checkpoint's records."""
    data = render_records(directory, files)
    return RecordsFile(records_name(index), checksum_of(data), len(files)), data


def parse_reference(raw: Any, index: int, where: str) -> RecordsFile:
    """A manifest's ``records`` field of checkpoint ``index``, checked: it can name only that
    checkpoint's record file."""
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest {where}: expected an object with file, checksum, count.")
    name, checksum, count = raw.get("file"), raw.get("checksum"), raw.get("count")
    if name != records_name(index):
        raise ManifestError(f"manifest {where}.file: {name!r} is not {records_name(index)!r}.")
    if not isinstance(checksum, str) or (why := checksum_problem(checksum)) is not None:
        raise ManifestError(f"manifest {where}.checksum: {checksum!r}: "
                            f"{why or 'expected a checksum'}.")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ManifestError(f"manifest {where}.count: expected a number of records.")
    parts = raw.get("parts", 0)
    if not _is_int(parts) or parts < 0:
        raise ManifestError(f"manifest {where}.parts: expected a number of parts.")
    return RecordsFile(name, checksum, count, parts)


def read_records(reference: RecordsFile, read: Callable[[str], bytes], where: str,
                 is_safe: Callable[[str], bool]) -> tuple[FileRecord, ...]:
    """The records a record file holds (or, for an index, its parts hold), read through
    ``read`` (a name relative to the experiment) and refused unless they are exactly what
    the manifest names."""
    body = _checked(read, reference.name, reference.checksum, f"manifest {where}")
    if not reference.parts:
        return _entries(body, "files", reference.count, reference.name, where, is_safe)
    parts = _index_parts(body, reference, where, is_safe)
    records = tuple(sorted((record for name, checksum, count in parts for record in _entries(
        _checked(read, name, checksum, f"{reference.name}"), "files", count, name, where,
        is_safe)), key=lambda r: r.path))
    if len(records) != reference.count:
        raise ManifestError(f"the parts {reference.name} names hold {len(records)} records, "
                            f"not the {reference.count} that manifest {where} records.")
    return records


def find_record(reference: RecordsFile, read: Callable[[str], bytes], where: str,
                is_safe: Callable[[str], bool], path: str, rank: int | None) -> FileRecord | None:
    """The record of ``path`` in an index of parts, read part by part, the part of ``rank``'s
    node first (a part is named by its node's first rank), until one holds it; None when none
    does. Raised as :func:`read_records` raises."""
    index = _checked(read, reference.name, reference.checksum, f"manifest {where}")
    for name, checksum, count in _nearest_first(_index_parts(index, reference, where, is_safe),
                                                rank):
        held: tuple[FileRecord, ...] = _entries(_checked(read, name, checksum, reference.name),
                                                "files", count, name, where, is_safe)
        if found := next((r for r in held if r.path == path), None):
            return found
    return None


_LEADER = re.compile(r"rank-(\d+)\.json$")


def _nearest_first(parts: Sequence[Part], rank: int | None) -> list[Part]:
    """``parts`` with the one of ``rank``'s node first: the last whose leader is not after it."""
    leaders = [int(m.group(1)) if (m := _LEADER.search(p.name)) else -1 for p in parts]
    mine = max((i for i, leader in enumerate(leaders) if 0 <= leader <= (rank or 0)),
               key=leaders.__getitem__, default=None)
    return list(parts) if mine is None else [parts[mine], *parts[:mine], *parts[mine + 1:]]


def _index_parts(body: Any, reference: RecordsFile, where: str,
                 is_safe: Callable[[str], bool]) -> tuple[Part, ...]:
    return _entries(body, "parts", reference.parts, reference.name, where,
                    lambda name: is_safe(name) and f"/{PARTS_DIR}/" in name)


def _checked(read: Callable[[str], bytes], name: str, checksum: str, by: str) -> Any:
    """The JSON body of file ``name``, refused unless its checksum is the one ``by`` records."""
    data = read(name)
    if checksum_of(data) != checksum:
        raise ManifestError(
            f"{name} does not match the checksum that {by} records (a damaged or replaced "
            "file); restore it from a backup. The other checkpoints are unaffected.")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) and body.get("format") == RECORDS_FORMAT else None


def _entries(body: Any, key: str, count: int, name: str, where: str,
             is_safe: Callable[[str], bool]) -> tuple[Any, ...]:
    """A record file's ``key`` list ("files", or an index's "parts"), each entry checked."""
    entries = body.get(key) if body is not None else None
    if not isinstance(entries, list) or len(entries) != count:
        raise ManifestError(f"{name} of manifest {where} is not a record file of {count} "
                            f"{'records' if key == 'files' else 'parts'}.")
    parse = _record if key == "files" else _part
    return tuple(parse(entry, is_safe, f"{name}: {key}[{i}]") for i, entry in enumerate(entries))


def _part(entry: Any, is_safe: Callable[[str], bool], where: str) -> Part:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
            and isinstance(entry[1], str) and _is_int(entry[2]) and entry[2] >= 0):
        raise ManifestError(f"{where}: expected [file, checksum, count].")
    name, checksum, count = entry
    if not is_safe(name):
        raise ManifestError(f"{where}: {name!r} is not a part of the checkpoint's records.")
    if (why := checksum_problem(checksum)) is not None:
        raise ManifestError(f"{where}: {why}.")
    return Part(name, checksum, count)


def _record(entry: Any, is_safe: Callable[[str], bool], where: str) -> FileRecord:
    if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
            and _is_int(entry[1]) and (entry[2] is None or _is_int(entry[2]))
            and isinstance(entry[3], str)):
        raise ManifestError(f"{where}: expected [path, size, rank, checksum].")
    path, size, rank, checksum = entry
    if not is_safe(path):
        raise ManifestError(f"{where}: {path!r} leaves the checkpoint directory.")
    if (why := checksum_problem(checksum)) is not None:
        raise ManifestError(f"{where}: {why}.")
    return FileRecord(path, size, rank, checksum)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class KeptApart(Sequence[FileRecord]):
    """The records of a checkpoint that the manifest keeps apart, read on first use.

    Reading a manifest reads none of them: ``hpckit ls``, a launcher or a tracker that never
    asks for a checkpoint's files pays nothing for them, and a rank that loads one file reads
    the index and, most often, one part (:meth:`find`). :attr:`problem` says why they cannot
    be used (a record file damaged, replaced or gone): that checkpoint then has no records,
    and only it is out of use. A read that fails otherwise (the storage) is raised at the
    access, and tried again at the next: it may work later.
    """

    def __init__(self, reference: RecordsFile, read: Callable[[str], bytes], where: str,
                 is_safe: Callable[[str], bool]) -> None:
        self.reference, self.where = reference, where
        self._read, self._is_safe = read, is_safe

    @cached_property
    def _loaded(self) -> tuple[tuple[FileRecord, ...], str | None]:
        try:
            return read_records(self.reference, self._read, self.where, self._is_safe), None
        except ManifestError as exc:
            return (), f"its records cannot be used: {exc}"
        except StorageError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            return (), f"its records cannot be used: {self.reference.name} is missing"

    @property
    def problem(self) -> str | None:
        return self._loaded[1]

    def find(self, path: str, rank: int | None = None) -> FileRecord | None:
        """The record of ``path``: of an index, read part by part, the part of ``rank``'s
        node first, until one holds it (``records.find_record``)."""
        if "_loaded" in self.__dict__ or not self.reference.parts:
            return next((r for r in self if r.path == path), None)
        try:
            return find_record(self.reference, self._read, self.where, self._is_safe, path, rank)
        except (ManifestError, StorageError):
            pass  # read whole, which says what is wrong (``problem``) or raises
        return next((r for r in self if r.path == path), None)

    def __len__(self) -> int:
        return len(self._loaded[0])

    @overload
    def __getitem__(self, i: int) -> FileRecord: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[FileRecord, ...]: ...
    def __getitem__(self, i: int | slice) -> FileRecord | tuple[FileRecord, ...]:
        return self._loaded[0][i]

    def __iter__(self) -> Iterator[FileRecord]:
        return iter(self._loaded[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return tuple(self) == tuple(other)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickling never reads. Read already (``CheckpointRecord.read()``, before a cached
        checkpoint goes to every rank), it goes with its records and without what it reads
        with, so that no rank reads them again; else unread, with it."""
        if "_loaded" in self.__dict__:
            return _kept_read, (self.reference, self.where, *self._loaded)
        return KeptApart, (self.reference, self._read, self.where, self._is_safe)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KeptApart({self.reference.name!r})"


def _kept_read(reference: RecordsFile, where: str, records: tuple[FileRecord, ...],
               problem: str | None) -> KeptApart:
    kept = KeptApart(reference, _read_nothing, where, lambda _: False)
    kept.__dict__["_loaded"] = (records, problem)
    return kept


def _read_nothing(name: str) -> bytes:
    raise ManifestError(f"{name} was read before these records were sent (a bug in hpckit: "
                        "please report it)")
