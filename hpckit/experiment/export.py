"""Copying a committed checkpoint elsewhere, checking every byte against the manifest."""

from __future__ import annotations

from hpckit.errors import CheckpointError
from hpckit.experiment import ownership
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.storage import files
from hpckit.storage.checksum import algorithm_of, short
from hpckit.storage.copy import copy_file, progress
from hpckit.storage.location import Location


def export(source: Location, record: CheckpointRecord, target: Location) -> int:
    """Copy ``record``'s files from ``source`` to ``target``; raise if any differs from the
    manifest (the partial copy of that file is removed). Returns the bytes copied. A target
    in an experiment is refused before anything is written: the copy would truncate the very
    files it reads, or write into another run's checkpoints."""
    refuse_target(source, target)
    if record.damaged is not None:
        raise CheckpointError(f"{record.directory} cannot be exported: {record.damaged}")
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


def refuse_target(checkpoint: Location, target: Location) -> None:
    """An export never writes into the experiment it reads, nor, on local storage, into any
    experiment."""
    experiment = checkpoint.path.rsplit("/", 1)[0]
    same_storage = checkpoint.is_local == target.is_local
    inside = same_storage and (target.path == experiment or target.path.startswith(f"{experiment}/"))
    if inside or (target.is_local and ownership.in_experiment(target.path)):
        which = "the one exported from" if inside else "a manifest.json above it"
        raise CheckpointError(
            f"{target.display} lies inside an experiment ({which}); hpckit export writes only "
            "outside every experiment: give a directory of its own, such as ./exported")
