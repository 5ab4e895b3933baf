"""The sweep manifest, ``{storage_path}/{name}/sweep.json``: the trials, their params and
status, and the seed that drew them. A value, replaced whole; :class:`SweepRecord` (rank 0's)
is the only writer, and writes it atomically, as the per-run manifest is written.

Each trial's own directory beside it is an ordinary hpckit experiment: its checkpoints,
metrics and attempts are there, not here; this file says only what ranks and compares them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow.fs

from hpckit.errors import HpckitError, ManifestError
from hpckit.experiment.manifest import SWEEP_NAME
from hpckit.experiment.values import jsonable
from hpckit.logs import log
from hpckit.storage import files
from hpckit.storage.location import Location

FILENAME = SWEEP_NAME
FORMAT = 1
SCHEDULED = 2  # a sweep with a scheduler or a search algorithm: decisions, events, its state
PENDING, RUNNING, PAUSED, TERMINATED, ERROR = "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"
PAUSE, STOP = "PAUSE", "STOP"  # what the scheduler told a running trial
SHORT = 60
STATE_FILE = "search-state-{:06d}.pkl"
STATE_PATTERN = re.compile(r"search-state-\d{6,}\.pkl")


@dataclass(frozen=True)
class Trial:
    index: int
    dirname: str
    config: dict[str, Any]  # as JSON; the exact params are drawn again from the seed
    status: str = PENDING
    error: str | None = None
    last: dict[str, Any] = field(default_factory=dict)
    # Scheduled sweeps only: what the scheduler told the trial's run (PAUSE, STOP), until it
    # ended; and its history: {"event": "paused" | "stopped" | "exploited" | "donated",
    # "iteration": ..., ...}, oldest first.
    decision: str | None = None
    events: tuple[dict[str, Any], ...] = ()

    @property
    def trial_id(self) -> str:
        return f"{self.index:05d}"


@dataclass(frozen=True)
class SweepManifest:
    name: str
    seed: int
    num_samples: int
    metric: str | None
    mode: str | None
    trials: tuple[Trial, ...]
    # Scheduled sweeps only: the scheduler's and the search algorithm's names, and the file
    # beside sweep.json that holds their state and the trials' exact params (written first).
    scheduler: str | None = None
    searcher: str | None = None
    state: str | None = None
    # How the process that planned the sweep was started (``run.job.command_record``, with
    # ``ranks``, its world size, and ``array``, a Slurm array task's), for ``hpckit resume``;
    # None in sweeps planned before hpckit recorded it.
    command: dict[str, Any] | None = None

    @property
    def scheduled(self) -> bool:
        return self.scheduler is not None or self.searcher is not None

    def with_trial(self, trial: Trial) -> SweepManifest:
        return replace(self, trials=tuple(trial if t.index == trial.index else t
                                          for t in self.trials))

    def to_json(self) -> dict[str, Any]:
        """Format 1 where nothing was scheduled (what earlier hpckit reads), else 2."""
        if not self.scheduled:
            body = {k: v for k, v in self.__dict__.items()
                    if k not in ("trials", "scheduler", "searcher", "state")}
            trials = [{k: v for k, v in t.__dict__.items() if k not in ("decision", "events")}
                      for t in self.trials]
            return {"format": FORMAT, **_without_none_command(body), "trials": trials}
        body = {k: v for k, v in self.__dict__.items() if k != "trials"}
        return {"format": SCHEDULED, **_without_none_command(body),
                "trials": [t.__dict__ for t in self.trials]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepManifest:
        if data.get("format", FORMAT) not in (FORMAT, SCHEDULED):
            raise ValueError(f"format {data.get('format')!r} is newer than this hpckit reads "
                             f"({SCHEDULED}); upgrade hpckit")
        trials = tuple(Trial(**{**t, "events": tuple(t.get("events") or ())})
                       for t in data["trials"])
        return cls(data["name"], data["seed"], data["num_samples"], data.get("metric"),
                   data.get("mode"), trials, data.get("scheduler"), data.get("searcher"),
                   data.get("state"), data.get("command"))

    def with_trials(self, trials: tuple[Trial, ...]) -> SweepManifest:
        return replace(self, trials=trials)


def _without_none_command(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "command" or v is not None}


def dirname(index: int, params: dict[str, Any], paths: list[tuple[str, ...]]) -> str:
    """``trial_00003_lr=0.01,batch_size=32``: the index, then the varied params, short."""
    parts = []
    for path in paths:
        value: Any = params
        for key in path:
            value = value[key]
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        parts.append(f"{path[-1]}={shown}")
    short = re.sub(r"[^A-Za-z0-9=.,_+-]", "_", ",".join(parts))[:SHORT]
    return f"trial_{index:05d}" + (f"_{short}" if short else "")


class SweepRecord:
    """Rank 0's owner of the sweep manifest."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.file = location.join(FILENAME)

    def load(self) -> SweepManifest | None:
        if files.file_type(self.file) == pyarrow.fs.FileType.NotFound:
            return None
        try:
            return SweepManifest.from_json(json.loads(files.read_bytes(self.file)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"{self.file.display} is not a readable sweep manifest ({exc}); "
                                "move it aside to start the sweep anew.") from exc

    def save(self, manifest: SweepManifest) -> None:
        files.make_dir(self.location)
        text = json.dumps(jsonable(manifest.to_json()), indent=1, sort_keys=True)
        files.write_atomic(self.file, text.encode())

    def save_state(self, version: int, data: bytes) -> str:
        """A new state file (the scheduler's and searcher's state, the trials' params), named
        by ``version``; :meth:`save` then names it in sweep.json, the commit."""
        name = STATE_FILE.format(version)
        files.write_atomic(self.location.join(name), data)
        return name

    def load_state(self, name: str) -> bytes:
        if not STATE_PATTERN.fullmatch(name):
            raise ManifestError(f"{self.file.display} names {name!r} as its state, which is not "
                                "a state file of hpckit's; move sweep.json aside to start anew.")
        return files.read_bytes(self.location.join(name))

    def remove_state(self, name: str) -> None:
        """A state file that sweep.json no longer names: best-effort."""
        try:
            files.delete_file(self.location.join(name), missing_ok=True)
        except HpckitError as exc:
            log.debug("could not remove %s: %s", name, exc)
