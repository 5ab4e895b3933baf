"""The fault-injection suite's bookkeeping: what every trial found, for the session summary
(and docs/reliability.md), and the checks every trial must pass."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs

from hpckit.result import result_read
from hpckit.experiment import verify as _verify
from hpckit.experiment.leftovers import stray_records
from hpckit.experiment.manifest import (
    MANIFEST_NAME,
    METRICS_NAME,
    CheckpointRecord,
    Manifest,
    is_checkpoint_dirname,
)
from hpckit.experiment.reading import read_manifest
from hpckit.experiment.retention import rank_best_first
from hpckit.storage import files as _storage
from hpckit.storage.location import Location, resolve

TRIALS: list[dict] = []


@dataclass
class State:
    """What a trial left behind, checked."""

    latest: str | None
    committed: list[str]
    leftovers: list[str] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    opened: bool = False  # a run wrote the manifest: the next one resumes the experiment
    attempts: int = 0  # the runs that opened the experiment, as the manifest records them
    next_index: int = 0  # the index of the next checkpoint a run starts
    # Checkpoints committed before a trial that retention keeps, missing after one: the chain's
    # losses so far (check_experiment counts them; a chain asserts at its end that none was).
    lost: list[str] = field(default_factory=list)
    records: tuple[CheckpointRecord, ...] = field(default=(), repr=False)
    # Each attempt's checkpoint it resumed from, as the manifest records it (None: from the start).
    resumed_from: tuple[str | None, ...] = ()

    def lost_since(self, before: State) -> int:
        """How many committed checkpoints the trial that went from ``before`` to this lost."""
        return len(self.lost) - len(before.lost)


def check_experiment(experiment: Path | str, before: State | None) -> State:
    """The manifest parses; every checkpoint it names is complete (sizes and checksums); the
    latest only moves forward. Every checkpoint ``before`` names that retention keeps must
    still be named: each one that is not is counted lost. ``experiment`` is a local directory
    or a URI."""
    location = resolve(str(experiment))
    earlier_losses = list(before.lost) if before is not None else []
    if _storage.file_type(location.join(MANIFEST_NAME)) == pyarrow.fs.FileType.NotFound:
        assert before is None or before.latest is None, f"the manifest vanished after {before}"
        return State(None, [], lost=earlier_losses)
    manifest = read_manifest(location)  # with every record file it names, checksums matched
    assert manifest is not None
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
                 [n for n in entries if n.startswith(f".{MANIFEST_NAME}.tmp-")]
                 + list(stray_records(location, manifest)),
                 opened=True, attempts=len(manifest.attempts),
                 next_index=manifest.next_checkpoint_index,
                 lost=earlier_losses + (lost(before, manifest) if before is not None else []),
                 records=manifest.checkpoints,
                 resumed_from=tuple(a.resumed_from for a in manifest.attempts))


def lost(before: State, manifest: Manifest) -> list[str]:
    """The checkpoints ``before`` names that ``manifest`` no longer does, though its retention
    keeps them. (A checkpoint named but incomplete fails check_experiment outright.)"""
    named = {r.directory for r in manifest.checkpoints}
    return [r.directory for r in before.records
            if r.directory not in named and not outranked(r, manifest)]


def outranked(record: CheckpointRecord, manifest: Manifest) -> bool:
    """Whether retention may have evicted ``record``: ``num_to_keep`` of the checkpoints that
    ``manifest`` keeps rank ahead of it (those awaiting validation have no rank yet, and are
    kept besides)."""
    keep = manifest.retention.get("num_to_keep")
    if keep is None:
        return False
    ranked = [r for r in manifest.checkpoints if not (r.validation and r.validation.pending)]
    order = rank_best_first([*ranked, record], manifest.retention.get("checkpoint_score_attribute"),
                            manifest.retention.get("checkpoint_score_order", "max"))
    return [r.directory for r in order].index(record.directory) >= keep


def seen(manifest: Manifest) -> State:
    """A manifest read while its run went on, as the State to compare what it left with."""
    latest = manifest.latest.directory if manifest.latest else None
    return State(latest, sorted(r.directory for r in manifest.checkpoints), opened=True,
                 attempts=len(manifest.attempts), next_index=manifest.next_checkpoint_index,
                 records=manifest.checkpoints,
                 resumed_from=tuple(a.resumed_from for a in manifest.attempts))


def reported(experiment: Path | str) -> State:
    """Every checkpoint that metrics.jsonl has a line of, as the State to compare the end of a
    run with: what a run committed, when nothing killed it (after a kill, a line may be of a
    commit that never landed)."""
    records = tuple(CheckpointRecord(int(e["checkpoint"].rsplit("_", 1)[1]), e["checkpoint"],
                                     e["step"], e["time"], e["metrics"], ())
                    for e in metrics_lines(resolve(str(experiment))) if e["checkpoint"])
    latest = max(records, key=lambda r: r.index, default=None)
    return State(latest.directory if latest else None, sorted(r.directory for r in records),
                 opened=True, records=records)


def metrics_lines(location: Location) -> list[dict]:
    path = location.join(METRICS_NAME)
    if _storage.file_type(path) == pyarrow.fs.FileType.NotFound:
        return []
    return [json.loads(line) for line in _storage.read_bytes(path).decode().splitlines()
            if line.strip()]


def check_metrics(location, manifest: Manifest) -> None:
    """The metrics are never behind the latest committed checkpoint: metrics.jsonl holds its
    line, and ``Result.from_path`` shows its metrics or a later report's."""
    latest = manifest.latest
    if latest is None:
        return
    lines = metrics_lines(location)
    own = [e for e in lines if e["step"] == latest.step]
    validated = (latest.validation.metrics if latest.validation else None) or {}
    assert own and {**own[-1]["metrics"], **validated} == latest.metrics, \
        f"metrics.jsonl lacks step {latest.step} of {latest.directory}: {lines[-3:]}"
    shown = result_read(location)
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
