"""``hpckit ls``: the checkpoints of one experiment, the trials of a sweep, or the experiments
under a storage root."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click
import pyarrow.fs

from hpckit import settings
from hpckit.cli.app import main
from hpckit.cli.common import open_experiment
from hpckit.cli.tables import echo_json, echo_table, moment, number, size
from hpckit.errors import StorageError
from hpckit.experiment import retention
from hpckit.experiment.manifest import Manifest
from hpckit.experiment.reading import list_experiments, read_last_metrics
from hpckit.logs import log
from hpckit.run.job import DEFAULT_STORAGE
from hpckit.storage import files
from hpckit.storage.location import Location, resolve
from hpckit.sweep.progress import counts, trial_states, varied
from hpckit.sweep.record import SweepManifest, SweepRecord


@main.command("ls")
@click.argument("experiment", required=False)
@click.option("--root", default=None,
              help="List the experiments under this storage root (default: $HPCKIT_STORAGE, "
                   "else ~/hpckit_results).")
@click.option("--metric", "metrics", multiple=True, help="Metric columns to show (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print exact values as JSON.")
def ls(experiment: str | None, root: str | None, metrics: tuple[str, ...], as_json: bool) -> None:
    """List the committed checkpoints of EXPERIMENT (a path or URI), or, given a storage root
    or nothing, its experiments, newest first: status (running, finished, failed,
    hung, interrupted, requeued, stopped), attempts, last step, best metric, latest checkpoint,
    last update and the size of the kept checkpoints. Given a sweep (hpckit.tune), its
    trials: status, the params that vary, the best value of its metric, checkpoints kept.

    Markers: * latest, + best by the experiment's retention score.

    Example: hpckit ls ~/hpckit_results/resnet-fmnist --metric loss
    """
    if experiment is None:
        location = resolve(root or settings.current().storage or DEFAULT_STORAGE)
        if root is not None and files.file_type(location) == pyarrow.fs.FileType.NotFound:
            raise click.BadParameter(f"{location.display} does not exist; check the path, or "
                                     "leave --root out for $HPCKIT_STORAGE", param_hint="--root")
        _experiments(location, as_json)
        return
    sweep = SweepRecord(resolve(experiment)).load()
    if sweep is not None:
        list_sweep(resolve(experiment), sweep, as_json)
        return
    location, manifest = open_experiment(experiment, allow_root=True)
    if manifest is None:
        _experiments(location, as_json)
    else:
        _checkpoints(manifest, metrics, as_json)


def _checkpoints(manifest: Manifest, metrics: tuple[str, ...], as_json: bool) -> None:
    ranked = retention.ranked(manifest)
    best = ranked[0].directory if ranked else None
    latest = manifest.latest
    rows: list[dict[str, Any]] = [{"index": r.index, "directory": r.directory, "step": r.step,
             "reported_at": r.reported_at, "bytes": r.size, "latest": r is latest,
             "best": r.directory == best,
             "validation": r.validation.status if r.validation else None,
             "metrics": {k: v for k, v in r.metrics.items() if not metrics or k in metrics}}
            for r in manifest.checkpoints]
    if as_json:
        echo_json(rows)
        return
    names = list(dict.fromkeys(k for row in rows for k in row["metrics"]))
    validated = ["VALIDATION"] if any(row["validation"] for row in rows) else []
    header = ["", "CHECKPOINT", "STEP", "REPORTED", "SIZE", *validated, *names]
    table = [[("*" if row["latest"] else " ") + ("+" if row["best"] else " "), row["directory"],
              str(row["step"]), moment(row["reported_at"]), size(row["bytes"]),
              *([row["validation"] or "-"] if validated else []),
              *(number(row["metrics"].get(n)) for n in names)] for row in rows]
    echo_table(header, table, [False, False, True, False, True, *([False] * len(validated)),
                               *([True] * len(names))])


def _experiments(root: Location, as_json: bool) -> None:
    rows = sorted((_summary(root, name, manifest) for name, manifest in list_experiments(root)),
                  key=lambda r: r["updated"], reverse=True)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"no experiments under {root.display} yet")
        return
    header = ["EXPERIMENT", "STATUS", "ATTEMPTS", "STEP", "BEST", "LATEST", "UPDATED", "SIZE"]
    table = [[r["experiment"], r["status"], str(r.get("attempts", "-")),
              number(r.get("last_step")), _best(r.get("best")), r.get("latest") or "-",
              moment(r["updated"]), size(r.get("bytes"))] for r in rows]
    echo_table(header, table, [False, False, True, True, False, False, False, True])


def _summary(root: Location, name: str, manifest: Manifest | None) -> dict[str, Any]:
    if manifest is None:
        return {"experiment": name, "status": "unreadable manifest", "updated": 0.0}
    last = manifest.last_attempt
    try:
        reported = read_last_metrics(root.join(name))
    except StorageError as exc:  # one unreadable log costs its row's columns, not the listing
        log.warning("cannot read the metrics of %s: %s", name, exc)
        reported = None
    return {"experiment": name, "status": last.status.value if last else "?",
            "attempts": len(manifest.attempts), "checkpoints": len(manifest.checkpoints),
            "last_step": reported["step"] if reported else None,
            "best": _best_metric(manifest),
            "latest": manifest.latest.directory if manifest.latest else None,
            "updated": (last.ended_at or last.started_at) if last else manifest.created_at,
            "bytes": sum(r.size for r in manifest.checkpoints),
            "last_metrics": reported["metrics"] if reported else None}


def _best_metric(manifest: Manifest) -> dict[str, Any] | None:
    """The best kept checkpoint's score, by the retention the experiment records."""
    attribute = manifest.retention.get("checkpoint_score_attribute")
    ranked = retention.ranked(manifest)
    if attribute is None or not ranked:
        return None
    score = retention.score_of(ranked[0].metrics, attribute)
    if score is None:
        return None
    return {"metric": attribute, "value": score, "checkpoint": ranked[0].directory}


def _best(best: dict[str, Any] | None) -> str:
    return f"{best['metric']}={number(best['value'])}" if best else "-"


def list_sweep(location: Location, sweep: SweepManifest, as_json: bool) -> None:
    """``hpckit ls SWEEP``: a sweep's trials as a table, as Ray Tune's progress table shows
    them: status, the params that vary, the best value of the sweep's metric, checkpoints
    kept."""
    states = trial_states(location, sweep)
    if as_json:
        echo_json([asdict(s) for s in states])
        return
    params = varied(states)
    scheduled = ["SCHEDULER"] if any(s.history for s in states) else []  # paused, exploited...
    header = ["TRIAL", "STATUS", *params, f"BEST {sweep.metric or '-'}", "CHECKPOINTS", *scheduled]
    table = [[s.trial, s.status, *(number(s.config.get(k)) for k in params), number(s.best),
              str(s.checkpoints), *([s.history or "-"] if scheduled else [])] for s in states]
    echo_table(header, table, [False, False, *([True] * len(params)), True, True,
                               *([False] * len(scheduled))])
    click.echo(f"{len(states)} trial(s): " + ", ".join(f"{n} {s}"
                                                       for s, n in counts(states).items()))
