"""A sweep's trials as they stand, read from each trial's own run (the sweep manifest may
not know yet): status, reports so far, the sweep metric's last and best values, checkpoints
kept; and what a scheduler did to them (paused, stopped early, exploited another trial's
checkpoint), from the sweep manifest. ``hpckit ls SWEEP`` and the live progress table show
these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpckit.experiment.nested import flatten
from hpckit.experiment.reading import read_manifest, read_metrics
from hpckit.experiment.retention import score_of
from hpckit.storage.location import Location
from hpckit.sweep.record import ERROR, PAUSED, SweepManifest, Trial


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
    history: str = ""  # what the scheduler did: "paused at 3, exploited 00002 at 4"


def trial_states(location: Location, sweep: SweepManifest) -> list[TrialState]:
    return [_state(location, sweep, trial) for trial in sweep.trials]


def _state(location: Location, sweep: SweepManifest, trial: Trial) -> TrialState:
    directory = location.join(trial.dirname)
    manifest = read_manifest(directory)
    last = manifest.last_attempt if manifest else None
    status = last.status.value if last else ("error" if trial.status == ERROR else "pending")
    if trial.status == PAUSED and status != "running":
        status = "paused"  # its own run ended at the pause
    elif status == "finished" and trial.events and trial.events[-1].get("event") == "stopped":
        status = "stopped early"
    entries = read_metrics(directory) if manifest else []
    scores = [s for entry in entries if sweep.metric is not None
              and (s := score_of(entry["metrics"], sweep.metric)) is not None]
    best = (max(scores) if sweep.mode == "max" else min(scores)) if scores else None
    return TrialState(trial.dirname, status, flatten(trial.config), len(entries),
                      scores[-1] if scores else None, best,
                      len(manifest.checkpoints) if manifest else 0, trial.error,
                      history(trial))


def history(trial: Trial) -> str:
    """What the scheduler did to ``trial``, in a few words: each kind of event once, the
    last one's iteration, and how many times (``paused ×4, exploited 00002 at 12 ×2``)."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for event in trial.events:
        kinds.setdefault(str(event.get("event")), []).append(event)
    said = []
    for kind, events in kinds.items():
        last = events[-1]
        who = {"exploited": f" {last.get('donor')}", "donated": f" to {last.get('to')}"}.get(kind, "")
        at = f" at {last['iteration']}" if last.get("iteration") is not None else ""
        said.append(f"{kind}{who}{at}" + (f" ×{len(events)}" if len(events) > 1 else ""))
    return ", ".join(said)


def varied(states: list[TrialState]) -> list[str]:
    """The params whose values differ between trials (constants would only widen a table)."""
    keys = list(dict.fromkeys(k for s in states for k in s.config))
    return [k for k in keys if len({repr(s.config.get(k)) for s in states}) > 1]


def counts(states: list[TrialState]) -> dict[str, int]:
    """How many trials are in each status, in the order the statuses first appear."""
    found = dict.fromkeys(s.status for s in states)
    return {status: sum(s.status == status for s in states) for status in found}
