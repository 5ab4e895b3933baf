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

from hpckit.errors import ManifestError
from hpckit.experiment.manifest import SWEEP_NAME
from hpckit.experiment.values import jsonable
from hpckit.storage import files
from hpckit.storage.location import Location

FILENAME = SWEEP_NAME
FORMAT = 1
PENDING, RUNNING, TERMINATED, ERROR = "PENDING", "RUNNING", "TERMINATED", "ERROR"
SHORT = 60


@dataclass(frozen=True)
class Trial:
    index: int
    dirname: str
    config: dict[str, Any]  # as JSON; the exact params are drawn again from the seed
    status: str = PENDING
    error: str | None = None
    last: dict[str, Any] = field(default_factory=dict)

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

    def with_trial(self, trial: Trial) -> SweepManifest:
        return replace(self, trials=tuple(trial if t.index == trial.index else t
                                          for t in self.trials))

    def to_json(self) -> dict[str, Any]:
        body = {k: v for k, v in self.__dict__.items() if k != "trials"}
        return {"format": FORMAT, **body, "trials": [t.__dict__ for t in self.trials]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepManifest:
        trials = tuple(Trial(**t) for t in data["trials"])
        return cls(data["name"], data["seed"], data["num_samples"], data.get("metric"),
                   data.get("mode"), trials)


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
