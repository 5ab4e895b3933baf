"""Experiment.commit keeps the metrics and the manifest consistent when the manifest write
fails: the line is taken back when the manifest did not land, kept when it did. The failed
write is made by replacing the manifest writer (a fault that cannot be timed for real); the
kill harness (tests/test_kill.py) checks the same promise against real SIGKILLs."""

from __future__ import annotations

import json

import pytest

from hpckit.config import CheckpointConfig
from hpckit.errors import StorageError
from hpckit.experiment import experiment as owner
from hpckit.experiment.experiment import Experiment
from hpckit.experiment.manifest import CheckpointRecord, Manifest, checkpoint_dirname
from hpckit.experiment.metrics import MetricsLog
from hpckit.storage.location import resolve


def _record(index: int) -> CheckpointRecord:
    return CheckpointRecord(index, checkpoint_dirname(index), index, 0.0, {"loss": 1.0 / (index + 1)}, ())


def _opened(tmp_path) -> Experiment:
    location = resolve(str(tmp_path))
    experiment = Experiment(location, Manifest("exp", 1, {}, {}, {}, 0.0),
                            metrics=MetricsLog.resume(location, 0))
    experiment.commit(_record(0), CheckpointConfig())
    return experiment


def _steps(tmp_path) -> list[int]:
    return [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("landed", [False, True])
def test_a_failed_manifest_write_takes_the_metrics_line_back_unless_it_landed(
        tmp_path, monkeypatch, landed):
    experiment = _opened(tmp_path)
    write = owner._write

    def failing(location, manifest):
        if landed:
            write(location, manifest)  # replaced, then the directory's fsync fails
        raise StorageError(f"{location.display}: no space left on device (made by the test)")

    monkeypatch.setattr(owner, "_write", failing)
    with pytest.raises(StorageError):
        experiment.commit(_record(1), CheckpointConfig())
    assert _steps(tmp_path) == ([0, 1] if landed else [0])
    assert [e["step"] for e in experiment.history()] == _steps(tmp_path)
    named = [r["directory"] for r in json.loads((tmp_path / "manifest.json").read_text())["checkpoints"]]
    assert named == (["checkpoint_000000", "checkpoint_000001"] if landed else ["checkpoint_000000"])


def test_an_attempt_end_that_cannot_be_written_leaves_the_manifest_as_on_storage(
        tmp_path, monkeypatch):
    """#54: every change to the manifest is written first and only then held (end_attempt
    held the ended attempt before its write, which could fail)."""
    from hpckit.experiment.attempts import Attempt, AttemptStatus

    location = resolve(str(tmp_path))
    experiment = Experiment(location, Manifest("exp", 1, {}, {}, {}, 0.0).with_attempt(
        Attempt(0, AttemptStatus.RUNNING, 1.0)))
    experiment.commit(_record(0), CheckpointConfig())

    def failing(location, manifest):
        raise StorageError(f"{location.display}: no space left on device (made by the test)")

    monkeypatch.setattr(owner, "_write", failing)
    experiment.end_attempt(AttemptStatus.FINISHED)  # best-effort: said, not raised
    assert experiment.manifest.last_attempt.status is AttemptStatus.RUNNING
    on_storage = json.loads((tmp_path / "manifest.json").read_text())
    assert on_storage["attempts"][-1]["status"] == "running"
