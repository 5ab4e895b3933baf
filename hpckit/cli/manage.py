"""Commands that change what is stored: gc and export."""

from __future__ import annotations

import time

import click
import pyarrow.fs

from hpckit import _experiment, _lock, _retention, _storage, _transfer
from hpckit._env import Environment
from hpckit._manifest import is_checkpoint_dirname
from hpckit._uri import resolve
from hpckit.cli import _open, _record, main
from hpckit.errors import HpckitError


@main.command()
@click.argument("experiment")
@click.option("--keep", type=click.IntRange(min=1), default=None,
              help="Keep this many checkpoints (best by the retention score, else most recent).")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@click.option("--force", is_flag=True, help="Run even though a live run seems to hold the experiment.")
def gc(experiment: str, keep: int | None, dry_run: bool, force: bool) -> None:
    """Apply a retention policy to EXPERIMENT after the fact, and remove leftovers that no
    manifest names. The latest committed checkpoint is never deleted.

    Example: hpckit gc /lustre/me/runs/resnet --keep 2 --dry-run
    """
    location, manifest = _open(experiment)
    holder = _lock.read(location.join(_lock.LOCK_NAME))
    if holder is not None and not force and holder.stale(
            time.time(), _lock.stale_after(Environment.read())) is None:
        raise click.UsageError(f"{location.display} is in use by a run ({holder.describe()}); "
                               "wait for it to end, or pass --force if it is dead.")
    last = manifest.attempts[-1] if manifest.attempts else {}
    if last.get("status") == "running" and not force:
        raise click.UsageError(f"{location.display} looks running (attempt {last.get('attempt')} "
                               f"on {last.get('host')}, pid {last.get('pid')}); stop it first, or "
                               "pass --force if it died without saying so.")
    evicted = _retention.select_evictions(manifest.checkpoints,
                                          _retention.recorded_config(manifest, keep))
    named = {r.directory for r in manifest.checkpoints}
    leftovers = [i for i in _storage.list_dir(location) if i.type == pyarrow.fs.FileType.Directory
                 and is_checkpoint_dirname(i.base_name) and i.base_name not in named]
    leftover_bytes = {i.base_name: sum(size for _, size in _storage.list_files(location.join(i.base_name)))
                      for i in leftovers}
    freed = sum(r.size for r in evicted) + sum(leftover_bytes.values())
    verb = "would remove" if dry_run else "removed"
    if not dry_run and evicted:
        manifest.checkpoints = [r for r in manifest.checkpoints if r not in evicted]
        _experiment.write_manifest(location, manifest)  # the commit first, then the deletion
    for record in evicted:
        if not dry_run:
            _storage.delete_dir(location.join(record.directory))
        click.echo(f"{verb} {record.directory} ({record.size} B, evicted by retention)")
    for name, size in leftover_bytes.items():
        if not dry_run:
            _storage.delete_dir(location.join(name))
        click.echo(f"{verb} {name} ({size} B, named by no manifest)")
    click.echo(f"{verb} {len(evicted) + len(leftovers)} checkpoint(s), {freed} B"
               + (" (dry run: nothing was deleted)" if dry_run else " freed"))


@main.command()
@click.argument("experiment")
@click.argument("dest")
@click.option("--best", "which", flag_value="best", help="The best checkpoint by the retention score.")
@click.option("--latest", "which", flag_value="latest", default=True, help="The latest (default).")
@click.option("--index", type=int, default=None, help="The checkpoint with this index.")
def export(experiment: str, dest: str, which: str, index: int | None) -> None:
    """Copy one checkpoint of EXPERIMENT to DEST (a local directory or a storage URI),
    verifying every file's size and sha256 as it goes.

    Example: hpckit export /lustre/me/runs/resnet --best ./resnet-best
    """
    location, manifest = _open(experiment)
    if index is not None:
        record = _record(location, manifest, str(index))
    elif which == "best":
        best = _retention.ranked(manifest)
        if not best:
            raise click.UsageError(f"{location.display} has no committed checkpoint.")
        record = best[0]
    else:
        if manifest.latest is None:
            raise click.UsageError(f"{location.display} has no committed checkpoint.")
        record = manifest.latest
    try:
        target = resolve(dest)
        copied = _transfer.export(location.join(record.directory), record, target)
    except HpckitError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"exported {record.directory} ({len(record.files)} file(s), {copied} B, verified) "
               f"to {target.display}")
