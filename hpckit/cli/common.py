"""What the commands share: opening an experiment named on the command line."""

from __future__ import annotations

import click

from hpckit.experiment.manifest import CheckpointRecord, Manifest
from hpckit.experiment.reading import list_experiments, read_manifest
from hpckit.storage.location import Location, resolve


def open_experiment(experiment: str, allow_root: bool = False) -> tuple[Location, Manifest | None]:
    """The location and manifest of EXPERIMENT; with ``allow_root``, a storage root of
    experiments gives no manifest."""
    location = resolve(experiment)
    manifest = read_manifest(location)
    if manifest is None and allow_root and list_experiments(location):
        return location, None
    if manifest is None:
        raise click.UsageError(f"{location.display} has no manifest.json: it is not an hpckit "
                               "experiment directory (pass {storage_path}/{name}).")
    return location, manifest


def require(experiment: str) -> tuple[Location, Manifest]:
    location, manifest = open_experiment(experiment)
    if manifest is None:
        raise click.UsageError(f"{location.display} has no manifest.json: it is not an hpckit "
                               "experiment directory (pass {storage_path}/{name}).")
    return location, manifest


def find_record(location: Location, manifest: Manifest, name: str) -> CheckpointRecord:
    for record in manifest.checkpoints:
        if name in (record.directory, str(record.index)):
            return record
    kept = ", ".join(r.directory for r in manifest.checkpoints) or "none"
    raise click.UsageError(f"{location.display} has no committed checkpoint {name!r}; kept: {kept}.")
