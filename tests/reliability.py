"""The fault-injection suite's bookkeeping: what every trial found, for the session summary
(and docs/reliability.md), and the checks every trial must pass."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs

from hpckit import Result
from hpckit.experiment import verify as _verify
from hpckit.experiment.manifest import MANIFEST_NAME, METRICS_NAME, Manifest, is_checkpoint_dirname
from hpckit.storage import files as _storage
from hpckit.storage.location import resolve

TRIALS: list[dict] = []


@dataclass
class State:
    """What a trial left behind, checked."""

    latest: str | None
    committed: list[str]
    leftovers: list[str] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)


def check_experiment(experiment: Path | str, before: State | None) -> State:
    """The manifest parses; every checkpoint it names is complete (sizes and checksums); nothing
    committed before was lost (the latest only moves forward). ``experiment`` is a local
    directory or a URI."""
    location = resolve(str(experiment))
    if _storage.file_type(location.join(MANIFEST_NAME)) == pyarrow.fs.FileType.NotFound:
        assert before is None or before.latest is None, f"the manifest vanished after {before}"
        return State(None, [])
    manifest = Manifest.from_json(_storage.read_bytes(location.join(MANIFEST_NAME)), str(experiment))
    for record in manifest.checkpoints:
        problems = _verify.verify(location, record)
        assert not problems, f"{record.directory} is named by the manifest but damaged: {problems}"
    check_metrics(location, manifest)
    latest = manifest.latest.directory if manifest.latest else None
    if before is not None and before.latest is not None:
        assert latest is not None and latest >= before.latest, \
            f"committed {before.latest} was lost: the manifest's latest is now {latest}"
    named = {r.directory for r in manifest.checkpoints}
    entries = sorted(i.base_name for i in _storage.list_dir(location))
    return State(latest, sorted(named),
                 [n for n in entries if is_checkpoint_dirname(n) and n not in named],
                 [n for n in entries if n.startswith(f".{MANIFEST_NAME}.tmp-")])


def check_metrics(location, manifest: Manifest) -> None:
    """The metrics are never behind the latest committed checkpoint: metrics.jsonl holds its
    line, and ``Result.from_path`` shows its metrics or a later report's."""
    latest = manifest.latest
    if latest is None:
        return
    path = location.join(METRICS_NAME)
    lines = ([json.loads(line) for line in _storage.read_bytes(path).decode().splitlines()
              if line.strip()]
             if _storage.file_type(path) != pyarrow.fs.FileType.NotFound else [])
    own = [e for e in lines if e["step"] == latest.step]
    validated = (latest.validation.metrics if latest.validation else None) or {}
    assert own and {**own[-1]["metrics"], **validated} == latest.metrics, \
        f"metrics.jsonl lacks step {latest.step} of {latest.directory}: {lines[-3:]}"
    shown = Result._read(location)
    last = next((r for r in manifest.checkpoints if r.directory == lines[-1]["checkpoint"]), None)
    merged = (last.validation.metrics if last and last.validation else None) or {}
    assert shown.metrics == {**lines[-1]["metrics"], **merged} and \
        lines[-1]["step"] >= latest.step, \
        f"Result.from_path shows {shown.metrics}, behind {latest.directory} (step {latest.step})"


def record(suite: str, case: str, outcome: str, **details: object) -> None:
    TRIALS.append({"suite": suite, "case": case, "outcome": outcome, **details})


def summary() -> list[str]:
    """One line per (suite, case): trials and outcomes, for the terminal and the docs."""
    grouped: dict[tuple[str, str], Counter[str]] = {}
    lost: Counter[tuple[str, str]] = Counter()
    for t in TRIALS:
        grouped.setdefault((t["suite"], t["case"]), Counter())[t["outcome"]] += 1
        lost[(t["suite"], t["case"])] += int(t.get("lost", 0))
    lines = []
    for (suite, case), outcomes in grouped.items():
        shown = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
        lines.append(f"{suite} | {case} | {sum(outcomes.values())} | {shown} | "
                     f"{lost[(suite, case)]} lost")
    target = os.environ.get("HPCKIT_RELIABILITY_LOG")
    if target and TRIALS:
        with open(target, "w") as f:
            f.writelines(json.dumps(t) + "\n" for t in TRIALS)
    return lines
