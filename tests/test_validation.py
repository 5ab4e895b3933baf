"""Ray 2.60's checkpoint validation on MPI ranks: a slow validation function runs in a
process of its own on rank 0's node while the ranks train; its metrics go into the
checkpoint's manifest record, retention keeps the best validated checkpoints, failures and
timeouts are recorded as Ray records them, and a run killed while validating validates the
pending checkpoints once it resumes. DataParallelTrainer: torch is not the point here."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import reliability
from conftest import HERE, HPCKIT, manifest, mpiexec, run

VALIDATED = HERE / "ranks" / "validated.py"


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None, expect: int | None = 0):
    return mpiexec(3, "--storage", str(tmp_path), *args, script=VALIDATED, timeout=180,
                   env=env, expect=expect)


def _validations(tmp_path: Path, name: str = "val") -> Counter:
    log = tmp_path / f"{name}-validations.log"
    return Counter(line.split()[0] for line in log.read_text().splitlines())


def _kept(tmp_path: Path, name: str = "val") -> dict[str, dict]:
    return {c["directory"]: c for c in manifest(tmp_path / name)["checkpoints"]}


def test_a_slow_validation_does_not_delay_training_and_retention_keeps_the_best_validated(
        tmp_path):
    plain = _run(tmp_path / "plain", "--name", "plain")
    validated = _run(tmp_path, "--validate-seconds", "2", "--wait")
    loop, baseline = float(validated.line("LOOP")), float(plain.line("LOOP"))
    assert loop - baseline < 0.4, (loop, baseline, validated.output)
    # Odd epochs validate best: kept by their validated score, not the training loss.
    kept = _kept(tmp_path)
    assert sorted(kept) == ["checkpoint_000001", "checkpoint_000003"], kept
    for directory, record in kept.items():
        epoch = int(directory[-1])
        assert record["validation"]["status"] == "VALIDATED", record
        assert record["metrics"]["val_score"] == epoch + 10 * (epoch % 2), record
    assert _validations(tmp_path) == {f"checkpoint_00000{i}": 1 for i in range(4)}
    final = json.loads(validated.line("FINAL"))
    assert [name for name, _ in final["best"]] == ["checkpoint_000001", "checkpoint_000003"]
    assert final["metrics"]["val_score"] == 13.0  # the last report's, validated
    assert json.loads(validated.line("REPORTED")) == [  # worst to best, as in Ray
        ["checkpoint_000001", "VALIDATED", 11.0], ["checkpoint_000003", "VALIDATED", 13.0]]
    listed = run([HPCKIT, "ls", str(tmp_path / "val")], 30).output
    assert "VALIDATION" in listed and listed.count("VALIDATED") == 2, listed


def test_failed_and_timed_out_validations_are_recorded_and_rank_worst(tmp_path):
    run = _run(tmp_path, "--validate-seconds", "0.3", "--faulty")
    assert "checkpoint_000001: VALIDATION_FAILED (RuntimeError: validation of epoch 1 failed " \
           "on purpose)" in run.output, run.output
    assert "checkpoint_000002: VALIDATION_TIMEOUT (took longer than timeout_s=2; stopped)" \
        in run.output, run.output
    assert sorted(_kept(tmp_path)) == ["checkpoint_000000", "checkpoint_000003"]
    assert all(c["validation"]["status"] == "VALIDATED" for c in _kept(tmp_path).values())


def test_a_rank_killed_while_validating_leaves_it_pending_and_the_rerun_validates_once(
        tmp_path):
    killed = _run(tmp_path, "--validate-seconds", "1",
                  env={"HPCKIT_FAULT": "validating:0:2"}, expect=None)
    assert killed.returncode != 0 and killed.line("FINAL") is None, killed.output
    state = reliability.check_experiment(tmp_path / "val", None)
    pending = [d for d, c in _kept(tmp_path).items()
               if c["validation"]["status"] == "PENDING_VALIDATION"]
    assert "checkpoint_000001" in pending, _kept(tmp_path)
    rerun = _run(tmp_path, "--validate-seconds", "1")
    reliability.check_experiment(tmp_path / "val", state)
    assert "that an earlier attempt left pending" in rerun.output, rerun.output
    kept = _kept(tmp_path)
    assert sorted(kept) == ["checkpoint_000001", "checkpoint_000003"], kept
    assert all(c["validation"]["status"] == "VALIDATED" for c in kept.values()), kept
    # Validated once each; the one killed as it started may have run twice, recorded once.
    counts = _validations(tmp_path)
    assert set(counts) == {f"checkpoint_00000{i}" for i in range(4)}, counts
    assert all(n == 1 for d, n in counts.items() if d != "checkpoint_000001"), counts
