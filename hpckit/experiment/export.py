"""Copying a committed checkpoint elsewhere, checking every byte against the manifest."""

from __future__ import annotations

from hpckit.errors import CheckpointError
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.storage import files
from hpckit.storage.checksum import algorithm_of, short
from hpckit.storage.copy import copy_file, progress
from hpckit.storage.location import Location


def export(source: Location, record: CheckpointRecord, target: Location) -> int:
    """Copy ``record``'s files from ``source`` to ``target``; raise if any differs from the
    manifest (the partial copy of that file is removed). Returns the bytes copied."""
    with progress(record.size, f"exporting {record.directory}") as bar:
        for f in record.files:
            destination = target.join(f.path)
            size, digest = copy_file(source.join(f.path), destination, bar.update,
                                     algorithm_of(f.checksum))
            if (size, digest) != (f.size, f.checksum):
                files.delete_file(destination)
                raise CheckpointError(
                    f"{source.join(f.path).display} does not match the manifest (size {size} vs "
                    f"{f.size}, checksum {short(digest)} vs {short(f.checksum)}); the export stopped. "
                    "Run hpckit verify on the experiment, and export another checkpoint.")
    return record.size
