"""A checkpoint's records that its manifest keeps apart (formats 5 and 8,
``experiment.records``), read on first use rather than with the manifest."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import Any, overload

from hpckit.errors import ManifestError, StorageError
from hpckit.experiment.records import FileRecord, RecordsFile, find_record, read_records


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
