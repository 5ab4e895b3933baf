"""metrics.jsonl: one line per report, appended (or, where storage cannot append, its last
segment replaced: ``experiment.segments``), and once committed handed to the experiment's
trackers (``experiment.tracking``: TensorBoard scalars where tensorboard is installed,
MLflow, W&B)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from hpckit.errors import HpckitError
from hpckit.experiment.attempts import Attempt
from hpckit.experiment.manifest import METRICS_NAME, CheckpointRecord
from hpckit.experiment.reading import (
    SEGMENT_LINES,
    parse_line,
    read_log,
    read_manifest,
    read_metrics,
    rewrite_log,
    segment_name,
)
from hpckit.experiment.tensorboard import Scalars
from hpckit.experiment.tracking import Trackers
from hpckit.logs import log
from hpckit.storage import files
from hpckit.storage.location import Location


@dataclass
class MetricsLog:
    """The metrics log of an open experiment; held by its :class:`Experiment` only. Where the
    storage appends, lines are appended to ``metrics.jsonl`` and none is kept here; else only
    the last segment's lines are (``experiment.segments``)."""

    experiment: Location
    count: int  # lines in the log
    tail: list[str]  # the last segment's lines, where the storage cannot append
    trackers: Trackers | None = None

    @classmethod
    def resume(cls, experiment: Location, next_step: int,
               latest: CheckpointRecord | None = None, raw_lines: list[str] | None = None,
               trackers: Trackers | None = None) -> MetricsLog:
        """Keep the lines of steps before ``next_step``: later ones describe work being redone.
        The line of a checkpoint is written before its manifest, so a kill never leaves the
        metrics behind the manifest; an experiment written by an earlier hpckit (manifest
        first) may lack the line of its ``latest`` checkpoint: it is written again from the
        manifest. ``raw_lines``: the log as the caller read it; ``trackers``: the
        experiment's (by default its TensorBoard events alone)."""
        raw_lines = read_log(experiment) if raw_lines is None else raw_lines
        if trackers is None:
            trackers = Trackers({}, Scalars.open(experiment))
        kept, steps, unchanged = [], set(), None  # unchanged: the lines before the first dropped
        for number, raw in enumerate(raw_lines):
            entry = parse_line(raw)
            if entry is not None and entry.get("step", next_step) < next_step:
                kept.append(raw + "\n")
                steps.add(entry["step"])
            elif unchanged is None:
                unchanged = number
        dropped = sum(1 for raw in raw_lines if raw.strip()) - len(kept)
        if dropped:
            log.info("metrics.jsonl: dropped %d line(s) reported after the last committed "
                     "checkpoint; those steps run again", dropped)
        restored = latest is not None and latest.step not in steps
        if latest is not None and restored:
            log.info("metrics.jsonl: restored the line of step %d from the manifest (the run "
                     "ended between committing %s and logging it)", latest.step, latest.directory)
            kept.append(_line(latest.step, latest.reported_at, latest.metrics, latest.directory))
        if dropped or restored:
            rewrite_log(experiment, kept, len(raw_lines) if unchanged is None else unchanged)
        return cls(experiment, len(kept), _tail(experiment, kept), trackers)

    def append(self, step: int, metrics: dict[str, Any], checkpoint: str | None) -> None:
        line = _line(step, time.time(), metrics, checkpoint)
        if self.experiment.is_local:
            files.append_text(self.experiment.join(METRICS_NAME), line, lambda: line)
        else:
            tail = [] if self.count % SEGMENT_LINES == 0 else self.tail
            segment = self.experiment.join(segment_name(self.count // SEGMENT_LINES))
            files.write_atomic(segment, "".join([*tail, line]).encode())
            self.tail = [*tail, line]
        self.count += 1

    def tracked(self, step: int, metrics: dict[str, Any]) -> None:
        """A line now committed (its checkpoint's manifest written, or a report without
        one): to the experiment's trackers, which send it on off the commit."""
        if self.trackers is not None:
            self.trackers.log(step, metrics)

    def retract(self) -> None:
        """Take back the last line (its checkpoint did not commit); best-effort, since a
        resume drops such a line anyway."""
        if not self.count:
            return
        try:
            lines = [line + "\n" for line in read_log(self.experiment)][:self.count - 1]
            rewrite_log(self.experiment, lines, len(lines))  # only the last segment changes
            self.count, self.tail = len(lines), _tail(self.experiment, lines)
        except HpckitError as exc:
            log.warning("could not take back the metrics line of a checkpoint that was not "
                        "committed (%s); a resume drops it", exc)

    def retract_unless_committed(self, experiment: Location, directory: str) -> None:
        """The manifest write of ``directory``'s commit failed: take back its metrics line,
        unless the new manifest landed all the same (a failure after its rename), where the
        line must stay."""
        try:
            found = read_manifest(experiment)
        except HpckitError as exc:
            log.warning("could not tell whether %s was committed (%s); its metrics line stays, "
                        "and a resume drops it if it was not", directory, exc)
            return
        if found is None or not any(r.directory == directory for r in found.checkpoints):
            self.retract()

    def history(self) -> list[dict[str, Any]]:
        """Every line, read back from storage (the log is not held here)."""
        return read_metrics(self.experiment)

    def close(self, attempt: Attempt | None = None) -> None:
        """The experiment closes; its tracker runs end as ``attempt`` ended (None: another run
        took the experiment over, and its runs with it: they are left as they are)."""
        if self.trackers is not None:
            if attempt is not None:
                self.trackers.end(attempt.status)
            self.trackers.close()


def _tail(experiment: Location, lines: list[str]) -> list[str]:
    """The last segment's lines, where the storage cannot append."""
    if experiment.is_local or not lines:
        return []
    return lines[(len(lines) - 1) // SEGMENT_LINES * SEGMENT_LINES:]


def _line(step: int, at: float, metrics: dict[str, Any], checkpoint: str | None) -> str:
    return json.dumps({"step": step, "time": at, "checkpoint": checkpoint, "metrics": metrics},
                      allow_nan=False) + "\n"
