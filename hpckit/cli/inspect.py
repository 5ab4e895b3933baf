"""Commands that read an experiment: ls, show, verify, metrics, plot."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from typing import Any

import click

from hpckit import settings
from hpckit.cli import plot as _plot
from hpckit.cli.app import main
from hpckit.cli.common import find_record, open_experiment, require
from hpckit.experiment import retention as _retention
from hpckit.experiment import verify as _verify
from hpckit.experiment.reading import list_experiments, read_metrics
from hpckit.run.job import DEFAULT_STORAGE
from hpckit.storage.location import Location, resolve


@main.command("ls")
@click.argument("experiment", required=False)
@click.option("--metric", "metrics", multiple=True, help="Metric columns to show (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ls(experiment: str | None, metrics: tuple[str, ...], as_json: bool) -> None:
    """List the committed checkpoints of EXPERIMENT (a path or URI), or, given a storage root
    or nothing ($HPCKIT_STORAGE, else ~/hpckit_results), its experiments, newest first, with
    their status (running, finished, failed, interrupted, requeued, stopped).

    Markers: * latest, + best by the experiment's retention score.

    Example: hpckit ls ~/hpckit_results/resnet-fmnist --metric loss
    """
    if experiment is None:
        _list_experiments(resolve(settings.current().storage or DEFAULT_STORAGE), as_json)
        return
    location, manifest = open_experiment(experiment, allow_root=True)
    if manifest is None:
        _list_experiments(location, as_json)
        return
    ranked = _retention.ranked(manifest)
    best = ranked[0].directory if ranked else None
    latest = manifest.latest
    rows = [{"index": r.index, "directory": r.directory, "step": r.step,
             "reported_at": r.reported_at, "bytes": r.size, "latest": r is latest,
             "best": r.directory == best,
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
    location, manifest = require(experiment)
    if checkpoint is not None:
        record = find_record(location, manifest, checkpoint)
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
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.started_at))
        job = a.slurm.get("job_id")
        click.echo(f"  attempt {a.attempt}: {a.status.value} started {started}, "
                   f"{a.world_size} rank(s) via {a.launcher}"
                   + (f", Slurm job {job}" if job else "")
                   + (f": {a.error}" if a.error else ""))


@main.command()
@click.argument("experiment")
@click.argument("checkpoint", required=False)
def verify(experiment: str, checkpoint: str | None) -> None:
    """Re-read every file of EXPERIMENT's kept checkpoints (or one CHECKPOINT) and check its
    size and sha256 against the manifest; exit 1 listing what differs or is missing.

    Example: hpckit verify /lustre/me/runs/resnet
    """
    location, manifest = require(experiment)
    records = [find_record(location, manifest, checkpoint)] if checkpoint else list(manifest.checkpoints)
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
    location, _ = require(experiment)
    history = read_metrics(location)
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
@click.argument("experiments", nargs=-1, required=True)
@click.option("--metric", "metric_names", multiple=True, required=True,
              help="A metric to plot, one panel each (repeat for more).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="The image to write (.png, .pdf or .svg).")
@click.option("--x", "x_axis", default="step", show_default=True,
              help="The x axis: step, or a reported metric such as epoch.")
@click.option("--log/--linear", "log", default=None,
              help="The y scale (default: log where a metric spans more than two decades).")
def plot(experiments: tuple[str, ...], metric_names: tuple[str, ...], output: str,
         x_axis: str, log: bool | None) -> None:
    """Plot metrics of one or several EXPERIMENTS (overlaid), one panel per metric.

    Example: hpckit plot runs/lr0.1 runs/lr0.01 --metric loss --metric accuracy -o curves.png
    """
    series = []
    for experiment in experiments:
        location, manifest = require(experiment)
        series.append((manifest.experiment, read_metrics(location)))
    _plot.curves(series, list(metric_names), x_axis, output, log)
    click.echo(f"wrote {output}")


def _list_experiments(root: Location, as_json: bool) -> None:
    rows: list[dict[str, Any]] = []
    for name, manifest in list_experiments(root):
        if manifest is None:
            rows.append({"experiment": name, "status": "unreadable manifest", "updated": 0.0})
            continue
        last = manifest.last_attempt
        history = read_metrics(root.join(name))
        rows.append({"experiment": name, "status": last.status.value if last else "?",
                     "attempts": len(manifest.attempts), "checkpoints": len(manifest.checkpoints),
                     "latest": manifest.latest.directory if manifest.latest else None,
                     "updated": (last.ended_at or last.started_at) if last else manifest.created_at,
                     "last_metrics": history[-1]["metrics"] if history else None})
    rows.sort(key=lambda r: r["updated"], reverse=True)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo(f"no experiments under {root.display} yet")
        return
    click.echo(f"{'EXPERIMENT':30s} {'STATUS':12s} {'ATTEMPTS':>8} {'CHECKPOINTS':>11}  "
               f"{'LATEST':17s}  UPDATED")
    for row in rows:
        updated = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["updated"]))
        click.echo(f"{row['experiment']:30s} {row['status']:12s} {row.get('attempts', '-'):>8} "
                   f"{row.get('checkpoints', '-'):>11}  {row.get('latest') or '-':17s}  {updated}")
