"""Checkpoint: a directory of files on some filesystem, as in Ray Train."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.fs

from hpckit import settings, writes
from hpckit.errors import CheckpointError
from hpckit.experiment.encoding import FORMAT as MANIFEST_FORMAT
from hpckit.experiment.manifest import MANIFEST_NAME
from hpckit.experiment.ownership import experiment_of, inside
from hpckit.storage import files
from hpckit.storage.copy import download_dir, shared_copy
from hpckit.storage.location import Location, resolve

__all__ = ["Checkpoint"]

METADATA_NAME = ".metadata.json"


class Checkpoint:
    """A checkpoint directory, local or on remote storage.

    ``Checkpoint("/lustre/runs/exp/checkpoint_000003")``, ``Checkpoint("s3://bucket/...")`` or
    ``Checkpoint("bucket/exp/checkpoint_000003", filesystem=fs)``.

    Args:
        path: The checkpoint directory: a local path, or a URI (``file://``, ``s3://`` with
            hpckit's S3 options in its query, or another scheme pyarrow opens). With
            ``filesystem``, a path on that filesystem, without a scheme.
        filesystem: The pyarrow filesystem that ``path`` is on; None (the default) finds it
            from ``path``.

    Raises:
        CheckpointError: ``path`` is not a non-empty path or URI.
        ConfigError: A URI names no bucket or directory, or carries hpckit's S3 options on
            another scheme.
        StorageError: The URI's storage cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str],
                 filesystem: pyarrow.fs.FileSystem | None = None) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise CheckpointError(f"Checkpoint(path={path!r}) must be a non-empty path or URI.")
        self._location = resolve(path, filesystem)

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of a local directory, as handed to ``hpckit.report``.

        Args:
            path: An existing local directory; a relative path is made absolute.

        Raises:
            CheckpointError: ``path`` is not a path, does not exist, or is a file.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise CheckpointError(
                f"Checkpoint.from_directory({path!r}) needs a directory path, got "
                f"{type(path).__name__}.")
        local = os.path.abspath(os.fspath(path))
        if not os.path.exists(local):
            raise CheckpointError(
                f"Checkpoint.from_directory({local!r}): no such directory; save your files "
                "there first, then create the checkpoint.")
        if not os.path.isdir(local):
            raise CheckpointError(
                f"Checkpoint.from_directory({local!r}) is a file; pass the directory that "
                "holds it (e.g. its parent).")
        return cls(local)

    @property
    def path(self) -> str:
        """The checkpoint's path inside :attr:`filesystem`."""
        return self._location.path

    @property
    def filesystem(self) -> pyarrow.fs.FileSystem:
        return self._location.filesystem

    @property
    def uri(self) -> str:
        """Where the checkpoint is, without credentials."""
        return self._location.display

    def __repr__(self) -> str:
        return f"Checkpoint(filesystem={self.filesystem.type_name}, path={self.uri})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Checkpoint) and self.path == other.path
                and self.filesystem.equals(other.filesystem))

    def __hash__(self) -> int:
        return hash((self.filesystem.type_name, self.path))

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files: the directory itself when local,
        otherwise a copy in ``$HPCKIT_LOCAL_DIR`` that every process of this node opening
        the same checkpoint shares. It is downloaded once and removed when the last of them
        leaves; treat it as read-only."""
        if self._location.is_local:
            self._require_dir()
            yield self.path
            return
        self._require_dir()
        with shared_copy(self._location, _local_dir()) as directory:
            yield directory

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the checkpoint's files into ``path`` (a new temporary directory by default);
        never into the checkpoint itself or into any experiment.

        Args:
            path: A local directory, created if missing; a file already there is overwritten
                where the checkpoint has one of the same name. None (the default) makes
                a new directory in ``$HPCKIT_LOCAL_DIR`` (else the system's temporary
                directory), which the caller removes.

        Returns:
            The local directory that holds the copy.

        Raises:
            CheckpointError: The checkpoint is not a directory, or ``path`` lies inside the
                checkpoint or in an experiment.
            StorageError: The checkpoint's remote storage could not be read.
        """
        target = os.fspath(path) if path is not None else tempfile.mkdtemp(
            prefix="hpckit-checkpoint-", dir=_local_dir())
        self._require_dir()
        if path is not None:
            self._refuse_target(target)
        if self._location.is_local:
            shutil.copytree(self.path, target, dirs_exist_ok=True)
        else:
            download_dir(self._location, target)
        return target

    def get_metadata(self) -> dict[str, Any]:
        """The checkpoint's metadata dict (``{}`` when none was set)."""
        location = self._location.join(METADATA_NAME)
        kind = files.file_type(location)
        if kind == pyarrow.fs.FileType.NotFound:
            return {}
        if kind != pyarrow.fs.FileType.File:
            raise CheckpointError(f"{location.display} is not checkpoint metadata: it is a "
                                  "directory, not a file. Rename it, or set the metadata with "
                                  "Checkpoint.set_metadata() in a checkpoint without it.")
        try:
            metadata = json.loads(files.read_bytes(location))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{location.display} is not checkpoint metadata (JSON): {exc}. "
                                  "Set the metadata with Checkpoint.set_metadata().") from None
        if not isinstance(metadata, dict):
            raise CheckpointError(f"{location.display} is not checkpoint metadata: a JSON "
                                  f"object was expected, not {type(metadata).__name__}.")
        return metadata

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the metadata; it is stored as ``.metadata.json`` beside the files.

        Args:
            metadata: A dict of JSON values (NaN and infinity are refused).

        Raises:
            CheckpointError: ``metadata`` is not a dict of JSON values, the checkpoint is not
                a directory, or it is a committed checkpoint of an experiment (its files are
                checksummed in the manifest: set metadata before ``report()``, or on a copy).
        """
        if not isinstance(metadata, dict):
            raise CheckpointError(f"checkpoint metadata must be a dict, got {type(metadata).__name__}.")
        try:
            data = json.dumps(metadata, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint metadata must be JSON-serialisable: {exc}.") from None
        self._require_dir()
        self._refuse_if_committed()
        files.write_bytes(self._location.join(METADATA_NAME), data)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the existing metadata.

        Args:
            metadata: A dict of JSON values; its keys replace those already set.

        Raises:
            CheckpointError: As :meth:`set_metadata`.
        """
        self._refuse_if_committed()
        self.set_metadata({**self.get_metadata(), **metadata})

    def _refuse_if_committed(self) -> None:
        """A committed checkpoint's files are checksummed in its experiment's manifest: a new
        ``.metadata.json`` would make it fail verification, and the next run drop it."""
        experiment = self._location.parent
        manifest = experiment.join(MANIFEST_NAME)
        if files.file_type(manifest) != pyarrow.fs.FileType.File:
            return
        try:
            body = json.loads(files.read_bytes(manifest))
            if body.get("format") != MANIFEST_FORMAT:  # a project's own manifest.json
                return
            listed = body.get("checkpoints") or []
            committed = {entry.get("directory") for entry in listed if isinstance(entry, dict)}
        except (ValueError, AttributeError):
            return
        if self._location.name in committed:
            raise CheckpointError(
                f"{self._location.display} is a committed checkpoint of {experiment.display}; "
                "its files are checksummed in the manifest, so its metadata cannot change in "
                "place. Set metadata before report(), or on a copy: "
                "Checkpoint.from_directory(checkpoint.to_directory()).update_metadata(...)")

    def _refuse_target(self, target: str) -> None:
        """A copy onto the checkpoint itself truncates what it reads; one into an experiment
        overwrites its manifest or a committed checkpoint's checksummed files."""
        real = os.path.realpath(target)
        if self._location.is_local and inside(real, self._location.path):
            raise CheckpointError(f"Checkpoint.to_directory({target!r}) is inside the checkpoint "
                                  f"{self.uri} itself; choose a directory outside it.")
        holder = experiment_of(real)
        if holder is not None:
            raise CheckpointError(
                f"Checkpoint.to_directory({target!r}) lies in experiment {holder}: the copy "
                "would overwrite its manifest or a committed checkpoint's files. Choose a "
                "directory outside every experiment.")

    def _whose_files_are_written_when(self, wait: Callable[[], Any]) -> Checkpoint:
        """This checkpoint, whose files are complete once ``wait()`` returns (a save still
        running, e.g. torch DCP's ``async_save``): ``report()`` waits for it before it reads
        them, in the background when the upload is asynchronous."""
        self._wait = wait
        return self

    def _wait_until_written(self) -> None:
        """Wait for the save this checkpoint was returned by, and for every save still
        writing into its directory, however the checkpoint object was made."""
        waits: list[Callable[[], Any]] = []
        wait = getattr(self, "_wait", None)
        if wait is not None:
            waits.append(wait)
        if self._location.is_local:
            waits += writes.waits_for(self._location.path)
        errors: list[Exception] = []
        for pending in waits:  # every one, so that none is left writing, and none unheard
            try:
                pending()
            except Exception as exc:  # noqa: BLE001  (collected, raised together below)
                errors.append(exc)
        if len(errors) > 1:
            raise CheckpointError(
                f"{len(errors)} writes into checkpoint {self.uri} failed: "
                + "; ".join(str(error) for error in errors)) from errors[0]
        if errors:
            raise errors[0]

    def _require_dir(self) -> None:
        kind = files.file_type(self._location)
        if kind == pyarrow.fs.FileType.File:
            raise CheckpointError(f"checkpoint {self.uri} is a file; a checkpoint is a directory.")
        if kind == pyarrow.fs.FileType.NotFound and self._location.is_local:
            raise CheckpointError(f"checkpoint directory {self.uri} does not exist.")


def checkpoint_at(location: Location) -> Checkpoint:
    """The checkpoint at ``location`` (hpckit's own: a committed checkpoint, the latest)."""
    checkpoint = Checkpoint.__new__(Checkpoint)
    checkpoint._location = location
    return checkpoint


def location_of(checkpoint: Checkpoint) -> Location:
    """Where ``checkpoint`` is: its filesystem and path, and the form shown to users."""
    return checkpoint._location


def require_directory(checkpoint: Checkpoint) -> None:
    """Refuse a checkpoint that is a file, or a local directory that does not exist."""
    checkpoint._require_dir()


def wait_until_written(checkpoint: Checkpoint) -> None:
    """Until every save still writing into ``checkpoint``'s directory has finished."""
    checkpoint._wait_until_written()


def written_when(checkpoint: Checkpoint, wait: Callable[[], Any]) -> Checkpoint:
    """``checkpoint``, whose files are complete once ``wait()`` returns (a save still
    running, e.g. torch DCP's ``async_save``): ``report()`` waits for it before it reads
    them, in the background when the upload is asynchronous."""
    return checkpoint._whose_files_are_written_when(wait)


def _local_dir() -> str | None:
    return settings.current().local_dir
