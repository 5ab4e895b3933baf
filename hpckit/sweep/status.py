"""A sweep's trials as they stand, read from each trial's own run (the sweep manifest may
not know yet): status, reports so far, the sweep metric's last and best values, checkpoints
kept. ``hpckit ls SWEEP`` and the live progress table show these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpckit.experiment.nested import flatten
from hpckit.experiment.reading import read_manifest, read_metrics
from hpckit.experiment.retention import score_of
from hpckit.storage.location import Location
from hpckit.sweep.record import ERROR, SweepManifest, Trial


@dataclass(frozen=True)
class TrialState:
    trial: str
    status: str  # the last attempt's (finished, running, failed, ...), else pending or error
    config: dict[str, Any]  # flattened: "model.width" for nested params
    reports: int
    last: float | None  # the sweep metric in the latest report
    best: float | None
    checkpoints: int
    error: str | None


def trial_states(location: Location, sweep: SweepManifest) -> list[TrialState]:
    return [_state(location, sweep, trial) for trial in sweep.trials]


def _state(location: Location, sweep: SweepManifest, trial: Trial) -> TrialState:
    directory = location.join(trial.dirname)
    manifest = read_manifest(directory)
    last = manifest.last_attempt if manifest else None
    status = last.status.value if last else ("error" if trial.status == ERROR else "pending")
    entries = read_metrics(directory) if manifest else []
    scores = [s for entry in entries if sweep.metric is not None
              and (s := score_of(entry["metrics"], sweep.metric)) is not None]
    best = (max(scores) if sweep.mode == "max" else min(scores)) if scores else None
    return TrialState(trial.dirname, status, flatten(trial.config), len(entries),
                      scores[-1] if scores else None, best,
                      len(manifest.checkpoints) if manifest else 0, trial.error)


def varied(states: list[TrialState]) -> list[str]:
    """The params whose values differ between trials (constants would only widen a table)."""
    keys = list(dict.fromkeys(k for s in states for k in s.config))
    return [k for k in keys if len({repr(s.config.get(k)) for s in states}) > 1]


def counts(states: list[TrialState]) -> dict[str, int]:
    """How many trials are in each status, in the order the statuses first appear."""
    found = dict.fromkeys(s.status for s in states)
    return {status: sum(s.status == status for s in states) for status in found}
