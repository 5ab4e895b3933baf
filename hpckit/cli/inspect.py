"""Commands that read an experiment: show, verify, metrics, plot.

Metric curves of one or several experiments, one panel per metric (matplotlib, no display).

Every figure has a title, axis labels and a legend; a metric whose values span more than two
decades is drawn on a log scale (losses that fall from 100 to 0.01 are not a flat line);
steps and epochs get whole-number ticks.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from typing import Any

import click

from hpckit.cli.app import main
from hpckit.cli.common import find_record, require
from hpckit.cli.tables import duration, echo_json, echo_table, moment, number, size
from hpckit.errors import ConfigError
from hpckit.experiment import encoding
from hpckit.experiment import verify as _verify
from hpckit.experiment.attempts import config_changes, effective_configs
from hpckit.experiment.encoding import checkpoint_json
from hpckit.experiment.manifest import Manifest
from hpckit.experiment.reading import read_manifest, read_metrics
from hpckit.experiment.values import OWN_COLUMNS, metric_columns
from hpckit.storage.copy import algorithm_of
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
    series: Series = []
    for experiment in experiments:
        sweep = SweepRecord(resolve(experiment)).load()
        if sweep is not None:
            series.extend(_trials(resolve(experiment), sweep))
            continue
        location, manifest = require(experiment)
        series.append((manifest.experiment, read_metrics(location)))
    curves(series, list(metric_names), x_axis, output, log)
    click.echo(f"wrote {output}")


def _trials(location: Location, sweep: SweepManifest) -> Series:
    """Each trial of a sweep that has run, named by its directory."""
    trials = [(t.dirname, location.join(t.dirname)) for t in sweep.trials]
    return [(name, read_metrics(where)) for name, where in trials
            if read_manifest(where) is not None]


DECADES_FOR_LOG = 2.0
MAX_NAMED = 2
Series = list[tuple[str, list[dict[str, Any]]]]


def curves(series: Series, metrics: list[str], x_axis: str, output: str,
           log: bool | None = None) -> None:
    """Write the figure to ``output``; ``log`` True/False forces the scale, None decides."""
    import matplotlib.pyplot as plt

    fig = figure(series, metrics, x_axis, log)
    try:
        fig.savefig(output, dpi=100)
    finally:
        plt.close(fig)


def figure(series: Series, metrics: list[str], x_axis: str, log: bool | None = None) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3 * len(metrics)),
                             squeeze=False, sharex=True)
    try:
        for ax, metric in zip(axes[:, 0], metrics, strict=True):
            _panel(ax, series, metric, x_axis, log)
        axes[-1, 0].set_xlabel(x_axis)
        names = (", ".join(name for name, _ in series) if len(series) <= MAX_NAMED
                 else f"{len(series)} runs")  # a sweep's trials: the legend names them
        fig.suptitle(f"{' and '.join(metrics)} by {x_axis}: {names}")
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return fig


def _panel(ax: Any, series: Series, metric: str, x_axis: str, log: bool | None) -> None:
    from matplotlib.ticker import MaxNLocator

    values: list[float] = []
    whole_x = True
    for name, history in series:
        points = [(_x(e, x_axis), e["metrics"].get(metric)) for e in history]
        points = [(x, y) for x, y in points if _number(x) and _number(y)]
        if points:
            ax.plot(*zip(*points, strict=True), marker="." if len(points) < 50 else None,
                    label=name)
            values.extend(float(y) for _, y in points)
            whole_x = whole_x and all(float(x).is_integer() for x, _ in points)
    if not values:
        raise ConfigError(f"no experiment reported a numeric metric {metric!r} "
                          f"(against {x_axis!r}); check the name with hpckit metrics.")
    if log or (log is None and _spans_decades(values)):
        ax.set_yscale("log")
    if whole_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()


def _spans_decades(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return (len(positive) == len(values) and min(positive) > 0
            and max(positive) / min(positive) > 10 ** DECADES_FOR_LOG)


def _x(entry: dict[str, Any], axis: str) -> Any:
    return entry.get(axis) if axis == "step" else entry["metrics"].get(axis)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
