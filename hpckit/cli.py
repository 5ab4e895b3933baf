"""The ``hpckit`` command."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import posixpath
import shutil
import subprocess
import sys
import time
from typing import Any, overload

import click
import pyarrow.fs

import hpckit
from hpckit import _experiment, _launch, _plot, _retention, _slurm, _storage, _transfer, _verify
from hpckit._manifest import CheckpointRecord, Manifest, is_checkpoint_dirname
from hpckit._uri import Location, parent, redact, resolve, restore_credentials
from hpckit.config import CheckpointConfig
from hpckit.errors import HpckitError
from hpckit.result import Result


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


@main.command("ls")
@click.argument("experiment")
@click.option("--metric", "metrics", multiple=True, help="Metric columns to show (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ls(experiment: str, metrics: tuple[str, ...], as_json: bool) -> None:
    """List the committed checkpoints of EXPERIMENT (a path or URI), or, given a storage root,
    its experiments with their status (running, finished, failed, requeued, stopped).

    Markers: * latest, + best by the experiment's retention score.

    Example: hpckit ls ~/hpckit_results/resnet-fmnist --metric loss
    """
    location, manifest = _open(experiment, allow_root=True)
    if manifest is None:
        _list_experiments(location, as_json)
        return
    result = Result._build(location, manifest, [])
    best = result.best_checkpoints[0][0].path if result.best_checkpoints else None
    latest = manifest.latest
    rows = [{"index": r.index, "directory": r.directory, "step": r.step,
             "reported_at": r.reported_at, "bytes": r.size, "latest": r is latest,
             "best": location.join(r.directory).path == best,
             "metrics": {k: v for k, v in r.metrics.items() if not metrics or k in metrics}}
            for r in manifest.checkpoints]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for row, record in zip(rows, manifest.checkpoints, strict=True):
        mark = ("*" if row["latest"] else " ") + ("+" if row["best"] else " ")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.reported_at))
        click.echo(f"{mark} {row['directory']}  step {row['step']:>6}  {when}  "
                   f"{row['bytes']:>12} B  {json.dumps(row['metrics'])}")


@main.command()
@click.argument("experiment")
@click.argument("checkpoint", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def show(experiment: str, checkpoint: str | None, as_json: bool) -> None:
    """Show EXPERIMENT's config, command, world size and attempts, or one CHECKPOINT's files.

    CHECKPOINT is a directory name (checkpoint_000003) or an index (3).

    Example: hpckit show ~/hpckit_results/linear checkpoint_000004
    """
    location, manifest = _open(experiment)
    if checkpoint is not None:
        record = _record(location, manifest, checkpoint)
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(record), indent=1))
            return
        click.echo(f"{location.join(record.directory).display}  step {record.step}  "
                   f"{record.size} B  metrics {json.dumps(record.metrics)}")
        for f in record.files:
            click.echo(f"  {f.path:40s} {f.size:>12} B  rank {f.rank:<4} sha256 {f.sha256}")
        return
    body = json.loads(manifest.to_json())
    if as_json:
        click.echo(json.dumps({k: body[k] for k in body if k != "checkpoints"}, indent=1))
        return
    click.echo(f"experiment {manifest.experiment} at {location.display}")
    click.echo(f"world size {manifest.world_size}; command: {' '.join(manifest.command.get('argv', []))}")
    click.echo(f"config: {json.dumps(manifest.config)}")
    click.echo(f"retention: {json.dumps(manifest.retention)}; checkpoints kept: "
               f"{len(manifest.checkpoints)}; latest: {body['latest']}")
    for a in manifest.attempts:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.get("started_at", 0)))
        job = a.get("slurm", {}).get("job_id")
        click.echo(f"  attempt {a.get('attempt')}: {a.get('status')} started {started}, "
                   f"{a.get('world_size')} rank(s) via {a.get('launcher')}"
                   + (f", Slurm job {job}" if job else "")
                   + (f": {a['error']}" if a.get("error") else ""))


@main.command()
@click.argument("experiment")
@click.argument("checkpoint", required=False)
def verify(experiment: str, checkpoint: str | None) -> None:
    """Re-read every file of EXPERIMENT's kept checkpoints (or one CHECKPOINT) and check its
    size and sha256 against the manifest; exit 1 listing what differs or is missing.

    Example: hpckit verify /lustre/me/runs/resnet
    """
    location, manifest = _open(experiment)
    records = [_record(location, manifest, checkpoint)] if checkpoint else manifest.checkpoints
    problems = [p for record in records for p in _verify.verify(location, record)]
    files = sum(len(r.files) for r in records)
    if problems:
        for problem in problems:
            click.echo(f"BAD {problem}")
        click.echo(f"{len(problems)} of {files} file(s) in {len(records)} checkpoint(s) do not "
                   "match the manifest", err=True)
        sys.exit(1)
    click.echo(f"ok: {files} file(s) in {len(records)} checkpoint(s) match the manifest")


@main.command()
@click.argument("experiment")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
def metrics(experiment: str, fmt: str) -> None:
    """Print every report's metrics of EXPERIMENT (step, time, checkpoint, then the metrics).

    Example: hpckit metrics ~/hpckit_results/linear --format csv > linear.csv
    """
    location, _ = _open(experiment)
    history = _experiment.read_metrics(location)
    if fmt == "json":
        click.echo(json.dumps(history, indent=1))
        return
    names = list(dict.fromkeys(k for entry in history for k in entry["metrics"]))
    header = ["step", "time", "checkpoint", *names]
    rows = [[e["step"], e["time"], e.get("checkpoint") or "", *(e["metrics"].get(n, "") for n in names)]
            for e in history]
    if fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(header)
        writer.writerows(rows)
        return
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@main.command()
@click.argument("experiment")
@click.option("--keep", type=click.IntRange(min=1), default=None,
              help="Keep this many checkpoints (best by the retention score, else most recent).")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@click.option("--force", is_flag=True, help="Run even though the experiment looks running.")
def gc(experiment: str, keep: int | None, dry_run: bool, force: bool) -> None:
    """Apply a retention policy to EXPERIMENT after the fact, and remove leftovers that no
    manifest names. The latest committed checkpoint is never deleted.

    Example: hpckit gc /lustre/me/runs/resnet --keep 2 --dry-run
    """
    location, manifest = _open(experiment)
    last = manifest.attempts[-1] if manifest.attempts else {}
    if last.get("status") == "running" and not force:
        raise click.UsageError(f"{location.display} looks running (attempt {last.get('attempt')} "
                               f"on {last.get('host')}, pid {last.get('pid')}); stop it first, or "
                               "pass --force if it died without saying so.")
    config = CheckpointConfig(num_to_keep=keep,
                              checkpoint_score_attribute=manifest.retention.get("checkpoint_score_attribute"),
                              checkpoint_score_order=manifest.retention.get("checkpoint_score_order", "max"))
    evicted = _retention.select_evictions(manifest.checkpoints, config)
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
        result = Result._build(location, manifest, [])
        if not result.best_checkpoints:
            raise click.UsageError(f"{location.display} has no committed checkpoint.")
        name = posixpath.basename(result.best_checkpoints[0][0].path)
        record = _record(location, manifest, name)
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


@main.command()
@click.argument("experiments", nargs=-1, required=True)
@click.option("--metric", "metric_names", multiple=True, required=True,
              help="A metric to plot, one panel each (repeat for more).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="The image to write (.png, .pdf or .svg).")
@click.option("--x", "x_axis", default="step", show_default=True,
              help="The x axis: step, or a reported metric such as epoch.")
def plot(experiments: tuple[str, ...], metric_names: tuple[str, ...], output: str,
         x_axis: str) -> None:
    """Plot metrics of one or several EXPERIMENTS (overlaid), one panel per metric.

    Example: hpckit plot runs/lr0.1 runs/lr0.01 --metric loss --metric accuracy -o curves.png
    """
    series = []
    for experiment in experiments:
        location, manifest = _open(experiment)
        series.append((manifest.experiment, _experiment.read_metrics(location)))
    try:
        _plot.curves(series, list(metric_names), x_axis, output)
    except HpckitError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"wrote {output}")


def _list_experiments(root: Location, as_json: bool) -> None:
    rows: list[dict[str, Any]] = []
    for name, manifest in _experiment.list_experiments(root):
        if manifest is None:
            rows.append({"experiment": name, "status": "unreadable manifest"})
            continue
        history = _experiment.read_metrics(root.join(name))
        last = manifest.attempts[-1] if manifest.attempts else {}
        rows.append({"experiment": name, "status": last.get("status", "?"),
                     "checkpoints": len(manifest.checkpoints),
                     "latest": manifest.latest.directory if manifest.latest else None,
                     "last_metrics": history[-1]["metrics"] if history else None})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for row in rows:
        click.echo(f"{row['experiment']:30s} {row['status']:12s} {row.get('checkpoints', '-'):>4} "
                   f"checkpoint(s)  latest {row.get('latest')}  {json.dumps(row.get('last_metrics'))}")


def _record(location: Location, manifest: Manifest, name: str) -> CheckpointRecord:
    for record in manifest.checkpoints:
        if name in (record.directory, str(record.index)):
            return record
    kept = ", ".join(r.directory for r in manifest.checkpoints) or "none"
    raise click.UsageError(f"{location.display} has no committed checkpoint {name!r}; kept: {kept}.")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-n", "--ranks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of ranks to start on this node.")
@click.option("--max-failures", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Restarts after a failure (-1: no limit); each resumes from the manifest.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(ranks: int, max_failures: int, script: str, args: tuple[str, ...]) -> None:
    """Start SCRIPT on N ranks of this node with mpiexec, restarting it after failures.

    Example: hpckit run -n 4 --max-failures 3 train.py --epochs 10
    """
    try:
        code = _launch.run_script(ranks, [script, *args], max_failures)
    except HpckitError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


@main.command()
@click.argument("experiment")
@click.option("-n", "--ranks", type=click.IntRange(min=1), default=None,
              help="World size (default: the recorded one; changing it needs rank-0-only checkpoints).")
@click.option("--max-failures", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Restarts after a failure (-1: no limit).")
@click.option("--sbatch", "sbatch_file", type=click.Path(dir_okay=False), default=None,
              help="Write an sbatch script to FILE and submit it instead of running here.")
def resume(experiment: str, ranks: int | None, max_failures: int, sbatch_file: str | None) -> None:
    """Continue EXPERIMENT with the command, arguments and world size in its manifest.

    Example: hpckit resume /lustre/me/runs/resnet --sbatch resume-resnet.sbatch
    """
    location, manifest = _open(experiment)
    world = _world_size(manifest, ranks)
    command = manifest.command
    argv = [restore_credentials(a, experiment) for a in command.get("argv") or []]
    cwd = command.get("cwd") or os.getcwd()
    if not argv:
        raise click.UsageError(f"the manifest of {location.display} records no command to resume.")
    # The root as the user gave it (credentials included), never the redacted display form.
    root, _ = parent(experiment)
    env = {"HPCKIT_NAME": manifest.experiment, "HPCKIT_STORAGE": root}
    if sbatch_file:
        _submit(sbatch_file, argv, world, cwd, manifest.experiment,
                command.get("executable") or sys.executable, env)
        return
    click.echo(f"resuming {location.display} with {world} rank(s): {redact(' '.join(argv))}",
               err=True)
    try:
        code = _launch.run_script(world, argv, max_failures, cwd=cwd, extra_env=env)
    except HpckitError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)


def _world_size(manifest: Manifest, ranks: int | None) -> int:
    recorded = manifest.world_size
    if ranks is None or ranks == recorded:
        return recorded
    latest = manifest.latest
    writers = sorted({f.rank for f in latest.files}) if latest else []
    if any(r != 0 for r in writers):
        raise click.UsageError(
            f"-n {ranks} differs from the recorded world size {recorded}, but "
            f"{latest.directory if latest else ''} holds files written by ranks {writers}: "
            f"per-rank shards need the same world size. Use -n {recorded}, or reshard by hand.")
    return ranks


def _submit(path: str, argv: list[str], world: int, cwd: str, name: str, python: str,
            env: dict[str, str]) -> None:
    text = _slurm.render_sbatch(argv, world, cwd, name, python, env)
    with open(path, "w") as f:
        f.write(text)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise click.ClickException(f"wrote {path}, but sbatch is not on PATH; submit it on a "
                                   "login node with: sbatch " + path)
    out = subprocess.run([sbatch, "--parsable", path], capture_output=True, text=True)
    if out.returncode != 0:
        raise click.ClickException(f"sbatch {path} failed: {out.stderr.strip()}")
    click.echo(f"submitted job {out.stdout.strip().split(';')[0]} ({path})")
