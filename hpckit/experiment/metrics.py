"""metrics.jsonl: one line per report, appended (or rewritten where storage cannot append),
and mirrored as TensorBoard scalars where tensorboard is installed."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs

from hpckit.errors import HpckitError
from hpckit.experiment.manifest import METRICS_NAME, CheckpointRecord
from hpckit.experiment.reading import parse_line, read_lines, read_manifest
from hpckit.experiment.tensorboard import Scalars
from hpckit.logs import log
from hpckit.storage import files
from hpckit.storage.location import Location


@dataclass
class MetricsLog:
    """The metrics log of an open experiment; held by its :class:`Experiment` only."""

    location: Location
    lines: list[str]
    scalars: Scalars | None = None

    @classmethod
    def resume(cls, experiment: Location, next_step: int,
               latest: CheckpointRecord | None = None) -> MetricsLog:
        """Keep the lines of steps before ``next_step``: later ones describe work being redone.
        The line of a checkpoint is written before its manifest, so a kill never leaves the
        metrics behind the manifest; an experiment written by an earlier hpckit (manifest
        first) may lack the line of its ``latest`` checkpoint: it is written again from the
        manifest."""
        location = experiment.join(METRICS_NAME)
        raw_lines = read_lines(location) if files.file_type(location) != pyarrow.fs.FileType.NotFound else []
        kept, steps = [], set()
        for raw in raw_lines:
            entry = parse_line(raw)
            if entry is not None and entry.get("step", next_step) < next_step:
                kept.append(raw + "\n")
                steps.add(entry["step"])
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
            files.write_atomic(location, "".join(kept).encode())
        return cls(location, kept, Scalars.open(experiment))

    def append(self, step: int, metrics: dict[str, Any], checkpoint: str | None) -> None:
        line = _line(step, time.time(), metrics, checkpoint)
        files.append_text(self.location, line, lambda: "".join([*self.lines, line]))
        self.lines.append(line)
        if self.scalars is not None:
            self.scalars.add(step, metrics)

    def retract(self) -> None:
        """Take back the last line (its checkpoint did not commit); best-effort, since a
        resume drops such a line anyway."""
        if not self.lines:
            return
        self.lines.pop()
        try:
            files.write_atomic(self.location, "".join(self.lines).encode())
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
        return [json.loads(line) for line in self.lines]

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()


def _line(step: int, at: float, metrics: dict[str, Any], checkpoint: str | None) -> str:
    return json.dumps({"step": step, "time": at, "checkpoint": checkpoint, "metrics": metrics},
                      allow_nan=False) + "\n"
