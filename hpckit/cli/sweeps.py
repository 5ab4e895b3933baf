"""``hpckit ls SWEEP``: a sweep's trials as a table, as Ray Tune's progress table shows them:
status, the params that vary, the best value of the sweep's metric, checkpoints kept."""

from __future__ import annotations

from typing import Any

import click

from hpckit.cli.tables import echo_json, echo_table, number
from hpckit.experiment.nested import flatten
from hpckit.experiment.reading import read_manifest, read_metrics
from hpckit.experiment.retention import score_of
from hpckit.storage.location import Location
from hpckit.sweep.record import SweepManifest, Trial


def list_sweep(location: Location, sweep: SweepManifest, as_json: bool) -> None:
    rows = [_row(location, sweep, trial) for trial in sweep.trials]
    if as_json:
        echo_json(rows)
        return
    varied = _varied(rows)
    metric = sweep.metric or "-"
    header = ["TRIAL", "STATUS", *varied, f"BEST {metric}", "CHECKPOINTS"]
    table = [[r["trial"], r["status"], *(number(r["config"].get(k)) for k in varied),
              number(r["best"]), str(r["checkpoints"])] for r in rows]
    echo_table(header, table, [False, False, *([True] * len(varied)), True, True])
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    click.echo(f"{len(rows)} trial(s): " + ", ".join(f"{n} {s}" for s, n in counts.items()))


def _row(location: Location, sweep: SweepManifest, trial: Trial) -> dict[str, Any]:
    """A trial's status is its own run's (the sweep manifest may not know yet)."""
    directory = location.join(trial.dirname)
    manifest = read_manifest(directory)
    last = manifest.last_attempt if manifest else None
    status = last.status.value if last else ("error" if trial.status == "ERROR" else "pending")
    return {"trial": trial.dirname, "status": status, "config": flatten(trial.config),
            "best": _best(directory, sweep) if manifest else None,
            "checkpoints": len(manifest.checkpoints) if manifest else 0, "error": trial.error}


def _best(directory: Location, sweep: SweepManifest) -> float | None:
    if sweep.metric is None:
        return None
    scores = [s for entry in read_metrics(directory)
              if (s := score_of(entry["metrics"], sweep.metric)) is not None]
    if not scores:
        return None
    return max(scores) if sweep.mode == "max" else min(scores)


def _varied(rows: list[dict[str, Any]]) -> list[str]:
    """The params whose values differ between trials (constants would only widen the table)."""
    keys = list(dict.fromkeys(k for r in rows for k in r["config"]))
    return [k for k in keys if len({repr(r["config"].get(k)) for r in rows}) > 1]
