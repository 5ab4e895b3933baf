"""The live progress table of a running sweep, as Ray Tune's: trials running, pending and
done, each trial's params, reports and metric, and the best so far. Shown by the sweep's
rank 0 at most every ``EVERY`` seconds, when something changed, and only on a terminal:
in a batch job's output file the log's lines about each trial's start and end say the
same, once. Ranks that mpiexec started write to a pipe, not a terminal: ``HPCKIT_PROGRESS=1``
shows the table there too (``0`` never shows it).

A sweep's trials as they stand, read from each trial's own run (the sweep manifest may
not know yet): status, reports so far, the sweep metric's last and best values, checkpoints
kept; and what a scheduler did to them (paused, stopped early, exploited another trial's
checkpoint), from the sweep manifest. ``hpckit ls SWEEP`` and the live progress table show
these.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from hpckit.experiment.reading import read_manifest, read_metrics
from hpckit.experiment.retention import score_of
from hpckit.experiment.values import flatten
from hpckit.logs import log
from hpckit.storage.location import Location
from hpckit.sweep.record import ERROR, PAUSED, SweepManifest, Trial

ROWS_SHOWN = 20  # beyond this, the rows of running trials and the best ones
EVERY = 5.0  # seconds, as Ray Tune's default max_report_frequency


class Progress:
    """A thread that reads the trials' own runs and prints the table when it changed."""

    def __init__(self, location: Location, sweep: SweepManifest | Callable[[], SweepManifest],
                 shown: bool | None, every: float = EVERY, out: IO[str] | None = None) -> None:
        self.location = location
        self._sweep = sweep  # or where to read it: a search adds trials as it goes
        self.every = every
        self.out = out or sys.stdout
        self.shown = _is_terminal(self.out) if shown is None else shown
        self.started = time.monotonic()
        self._shown = ""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.shown:
            self._thread = threading.Thread(target=self._run, name="hpckit-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._thread is None:
            return
        self._done.set()
        self._thread.join()
        self.show()  # how the sweep ended

    def _run(self) -> None:
        while not self._done.wait(self.every):
            try:
                self.show()
            except Exception as exc:  # a storage hiccup must not end the sweep
                log.debug("progress table: %s", exc)

    @property
    def sweep(self) -> SweepManifest:
        return self._sweep() if callable(self._sweep) else self._sweep

    def show(self) -> None:
        sweep = self.sweep
        states = trial_states(self.location, sweep)
        text = render(sweep, states)
        if text != self._shown:
            self._shown = text
            elapsed = time.monotonic() - self.started
            self.out.write(f"\n{text.replace('{elapsed}', f'{elapsed:.0f} s')}\n")
            self.out.flush()


def render(sweep: SweepManifest, states: list[TrialState]) -> str:
    """The table; ``{elapsed}`` in its first line is left for the time of printing."""
    summary = ", ".join(f"{n} {s}" for s, n in counts(states).items())
    best = _best(sweep, states)
    lead = f"== Sweep {sweep.name}: {len(states)} trial(s): {summary} | {{elapsed}}"
    if best is not None:
        lead += f" | best {sweep.metric}={_number(best.best)} ({best.trial})"
    params = varied(states)
    metric = sweep.metric or "-"
    scheduled = any(s.history for s in states)
    header = ["TRIAL", "STATUS", *params, "REPORTS", metric, f"best {metric}",
              *(["SCHEDULER"] if scheduled else [])]
    rows = [[s.trial, s.status, *(_number(s.config.get(k)) for k in params), str(s.reports),
             _number(s.last), _number(s.best), *([s.history or "-"] if scheduled else [])]
            for s in _shown_states(sweep, states)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]
    hidden = len(states) - len(rows)
    return "\n".join([lead, *lines, *([f"... and {hidden} more trial(s)"] if hidden else [])])


def _best(sweep: SweepManifest, states: list[TrialState]) -> TrialState | None:
    scored = [s for s in states if s.best is not None and math.isfinite(s.best)]
    if not scored:
        return None
    pick = max if sweep.mode == "max" else min
    return pick(scored, key=lambda s: s.best or 0.0)


def _shown_states(sweep: SweepManifest, states: list[TrialState]) -> list[TrialState]:
    """All trials, or in a large sweep the running ones and then the best by the metric."""
    if len(states) <= ROWS_SHOWN:
        return states
    running = [s for s in states if s.status == "running"]
    scored = sorted((s for s in states if s.status != "running" and s.best is not None),
                    key=lambda s: s.best or 0.0, reverse=sweep.mode == "max")
    return (running + scored)[:ROWS_SHOWN]


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _is_terminal(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


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
