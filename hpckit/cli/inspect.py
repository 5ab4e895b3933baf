"""Commands that read an experiment: show, verify, metrics, plot."""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter

import click

from hpckit.cli import plot as _plot
from hpckit.cli.app import main
from hpckit.cli.common import find_record, require
from hpckit.cli.tables import duration, echo_json, echo_table, moment, number, size
from hpckit.experiment import encoding
from hpckit.experiment import verify as _verify
from hpckit.experiment.attempts import config_changes, effective_configs
from hpckit.experiment.encoding import checkpoint_json
from hpckit.experiment.manifest import Manifest
from hpckit.experiment.nested import OWN_COLUMNS, metric_columns
from hpckit.experiment.reading import read_manifest, read_metrics
from hpckit.storage.checksum import algorithm_of
from hpckit.storage.location import Location, resolve
from hpckit.sweep.record import SweepManifest, SweepRecord


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
            click.echo(json.dumps(checkpoint_json(record, inline=True), indent=1))
            return
        click.echo(f"{location.join(record.directory).display}  step {record.step}  "
                   f"{moment(record.reported_at)}  {size(record.size)}  metrics "
                   + ", ".join(f"{k}={number(v)}" for k, v in record.metrics.items()))
        if record.validation is not None:
            reason = f": {record.validation.error}" if record.validation.error else ""
            click.echo(f"validation {record.validation.status}{reason}")
        echo_table(["  FILE", "SIZE", "RANK", "CHECKSUM"],
                   [["  " + f.path, size(f.size), "?" if f.rank is None else str(f.rank),
                     f.checksum] for f in record.files],
                   [False, True, True, False])
        return
    body = json.loads(encoding.to_json(manifest))
    if as_json:
        click.echo(json.dumps({k: body[k] for k in body if k != "checkpoints"}, indent=1))
        return
    _show_experiment(location, manifest, body["latest"])


def _show_experiment(location: Location, manifest: Manifest, latest: str | None) -> None:
    click.echo(f"experiment {manifest.experiment} at {location.display}")
    click.echo(f"world size {manifest.world_size}; command: {' '.join(manifest.command.get('argv', []))}")
    click.echo(f"config: {json.dumps(manifest.config)}")
    click.echo(f"retention: {json.dumps(manifest.retention)}; checkpoints kept: "
               f"{len(manifest.checkpoints)}; latest: {latest}")
    configs = effective_configs(manifest.attempts)
    rows = []
    for i, a in enumerate(manifest.attempts):
        job = a.slurm.get("job_id")
        changes = config_changes(configs[i - 1], configs[i] or {}) if i else []
        error = a.error.splitlines()[0] if a.error else None
        notes = [*(["Slurm job " + job] if job else []), *changes, *([error] if error else [])]
        rows.append([str(a.attempt), a.status.value, moment(a.started_at), duration(a.duration),
                     str(a.world_size or "-"), a.launcher or "-", a.resumed_from or "-",
                     "; ".join(notes)])
    click.echo("attempts:")
    echo_table(["  #", "STATUS", "STARTED", "DURATION", "RANKS", "LAUNCHER", "RESUMED FROM",
                "CHANGED / ERROR"], rows, [True, False, False, True, True, False, False, False])


@main.command()
@click.argument("experiment")
@click.argument("checkpoint", required=False)
def verify(experiment: str, checkpoint: str | None) -> None:
    """Re-read every file of EXPERIMENT's kept checkpoints (or one CHECKPOINT) and check its
    size and checksum against the manifest (each with the algorithm it records); exit 1
    listing what differs or is missing.

    Example: hpckit verify /lustre/me/runs/resnet
    """
    location, manifest = require(experiment)
    records = [find_record(location, manifest, checkpoint)] if checkpoint else list(manifest.checkpoints)
    for record in [r for r in records if not r.on_storage]:
        click.echo(f"skipped {record.directory}: in the node-local caches of "
                   f"{', '.join(sorted(set(record.hosts)))} only; it is verified when a run "
                   "restarts from it")
    records = [r for r in records if r.on_storage]
    problems = [p for record in records for p in _verify.verify(location, record)]
    files = sum(len(r.files) for r in records)
    if problems:
        for problem in problems:
            click.echo(f"BAD {problem}")
        click.echo(f"{len(problems)} of {files} file(s) in {len(records)} checkpoint(s) do not "
                   "match the manifest", err=True)
        sys.exit(1)
    used = Counter(algorithm_of(f.checksum) for r in records for f in r.files)
    click.echo(f"ok: {files} file(s) in {len(records)} checkpoint(s) match the manifest"
               + (f" ({', '.join(f'{n} by {a}' for a, n in sorted(used.items()))})" if used else ""))


@main.command()
@click.argument("experiment")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
def metrics(experiment: str, fmt: str) -> None:
    """Print every report's metrics of EXPERIMENT (step, time, checkpoint, then the metrics):
    a table for people (floats to six significant digits, local times), or exact values as
    CSV or JSON.

    Example: hpckit metrics ~/hpckit_results/linear --format csv > linear.csv
    """
    location, _ = require(experiment)
    history = read_metrics(location)
    if fmt == "json":
        echo_json(history)
        return
    columns = [metric_columns(e["metrics"]) for e in history]
    names = list(dict.fromkeys(k for row in columns for k in row))
    header = [*OWN_COLUMNS, *names]
    if fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(header)
        writer.writerows([e["step"], e["time"], e.get("checkpoint") or "",
                          *(row.get(n, "") for n in names)] for e, row in zip(history, columns, strict=True))
        return
    rows = [[str(e["step"]), moment(e["time"]), e.get("checkpoint") or "-",
             *(number(row.get(n)) for n in names)] for e, row in zip(history, columns, strict=True)]
    echo_table(header, rows, [True, False, False, *([True] * len(names))])


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
    """Plot metrics of one or several EXPERIMENTS (overlaid), one panel per metric. A sweep
    (hpckit.tune) stands for every trial that has run.

    Example: hpckit plot runs/lr0.1 runs/lr0.01 --metric loss --metric accuracy -o curves.png
    """
    series: _plot.Series = []
    for experiment in experiments:
        sweep = SweepRecord(resolve(experiment)).load()
        if sweep is not None:
            series.extend(_trials(resolve(experiment), sweep))
            continue
        location, manifest = require(experiment)
        series.append((manifest.experiment, read_metrics(location)))
    _plot.curves(series, list(metric_names), x_axis, output, log)
    click.echo(f"wrote {output}")


def _trials(location: Location, sweep: SweepManifest) -> _plot.Series:
    """Each trial of a sweep that has run, named by its directory."""
    trials = [(t.dirname, location.join(t.dirname)) for t in sweep.trials]
    return [(name, read_metrics(where)) for name, where in trials
            if read_manifest(where) is not None]
