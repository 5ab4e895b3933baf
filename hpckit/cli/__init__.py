"""The ``hpckit`` command: one click group; the commands live in the modules beside this."""

from __future__ import annotations

from typing import overload

import click

import hpckit
from hpckit import _experiment
from hpckit._manifest import CheckpointRecord, Manifest
from hpckit._uri import Location, resolve
from hpckit.errors import HpckitError


@click.group()
@click.version_option(hpckit.__version__, prog_name="hpckit")
def main() -> None:
    """Batch training on HPC clusters: run, resume and inspect hpckit experiments."""
    from hpckit import _log

    _log.configure(0)


@overload
def _open(experiment: str) -> tuple[Location, Manifest]: ...
@overload
def _open(experiment: str, allow_root: bool) -> tuple[Location, Manifest | None]: ...
def _open(experiment: str, allow_root: bool = False) -> tuple[Location, Manifest | None]:
    try:
        location = resolve(experiment)
        manifest = _experiment.read_manifest(location)
    except HpckitError as exc:
        raise click.UsageError(str(exc)) from None
    if manifest is None and allow_root and _experiment.list_experiments(location):
        return location, None
    if manifest is None:
        raise click.UsageError(f"{location.display} has no manifest.json: it is not an hpckit "
                               "experiment directory (pass {storage_path}/{name}).")
    return location, manifest


def _record(location: Location, manifest: Manifest, name: str) -> CheckpointRecord:
    for record in manifest.checkpoints:
        if name in (record.directory, str(record.index)):
            return record
    kept = ", ".join(r.directory for r in manifest.checkpoints) or "none"
    raise click.UsageError(f"{location.display} has no committed checkpoint {name!r}; kept: {kept}.")


# The commands register themselves on `main` when imported.
from hpckit.cli import inspect, launch, manage  # noqa: E402,F401
