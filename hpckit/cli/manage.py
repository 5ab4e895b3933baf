"""Commands that change what is stored: gc and export."""

from __future__ import annotations

import click

from hpckit import settings
from hpckit.cli.app import main
from hpckit.cli.common import find_record, require
from hpckit.experiment import retention
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import CheckpointRecord, Manifest
from hpckit.experiment.mirror import export as export_checkpoint
from hpckit.storage.location import Location, resolve


@main.command()
@click.argument("experiment")
@click.option("--keep", type=click.IntRange(min=1), default=None,
              help="Keep this many checkpoints (best by the retention score, else most recent). "
                   "Without it, every committed checkpoint is kept and only leftovers go.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@click.option("--force", is_flag=True, help="Run even though a live run seems to hold the experiment.")
def gc(experiment: str, keep: int | None, dry_run: bool, force: bool) -> None:
    """Apply a retention policy to EXPERIMENT after the fact (--keep), and remove leftovers that
    no manifest names. The latest committed checkpoint is never deleted.

    Example: hpckit gc /lustre/me/runs/resnet --keep 2 --dry-run
    """
    location, _ = require(experiment)
    opened = Experiment.for_maintenance(location, settings.current(), force, dry_run)
    try:
        garbage = opened.collect_garbage(keep, dry_run)
    finally:
        opened.close()
    verb = "would remove" if dry_run else "removed"
    if keep is None:
        click.echo("no --keep: every committed checkpoint is kept; only leftovers that no "
                   "manifest names are removed")
    for record in garbage.evicted:
        click.echo(f"{verb} {record.directory} ({record.size} B, evicted by retention)")
    for name, size in garbage.leftovers.items():
        click.echo(f"{verb} {name} ({size} B, named by no manifest)")
    for name, size in garbage.kept.items():
        click.echo(f"kept {name} ({size} B, named by no manifest): the newest attempt says it "
                   "is running and may be writing it; the next run (or gc once one ended) "
                   "removes it")
    click.echo(f"{verb} {len(garbage.evicted) + len(garbage.leftovers)} checkpoint(s), "
               f"{garbage.size} B" + (" (dry run: nothing was deleted)" if dry_run else " freed"))


@main.command()
@click.argument("experiment")
@click.argument("dest")
@click.option("--best", "which", flag_value="best", help="The best checkpoint by the retention score.")
@click.option("--latest", "which", flag_value="latest", default=True, help="The latest (default).")
@click.option("--index", type=int, default=None, help="The checkpoint with this index.")
def export(experiment: str, dest: str, which: str, index: int | None) -> None:
    """Copy one checkpoint of EXPERIMENT to DEST (a local directory or a storage URI),
    verifying every file's size and checksum as it goes.

    Example: hpckit export /lustre/me/runs/resnet --best ./resnet-best
    """
    location, manifest = require(experiment)
    record = _chosen(location, manifest, which, index)
    target = resolve(dest)
    copied = export_checkpoint(location.join(record.directory), record, target)
    click.echo(f"exported {record.directory} ({len(record.files)} file(s), {copied} B, verified) "
               f"to {target.display}")


def _chosen(location: Location, manifest: Manifest, which: str, index: int | None) -> CheckpointRecord:
    if index is not None:
        return find_record(location, manifest, str(index))
    chosen = retention.ranked(manifest)[:1] if which == "best" else [manifest.latest]
    if not chosen or chosen[0] is None:
        raise click.UsageError(f"{location.display} has no committed checkpoint.")
    return chosen[0]
