"""Ray 2.60's checkpoint validation on MPI ranks: a slow validation function runs in a
process of its own on rank 0's node while the ranks train; its metrics go into the
checkpoint's manifest record, retention keeps the best validated checkpoints, failures and
timeouts are recorded as Ray records them, and a run killed while validating validates the
pending checkpoints once it resumes. DataParallelTrainer: torch is not the point here."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from support import reliability
from conftest import HERE, HPCKIT, MPIEXEC, manifest, mpiexec, run, stopped_after_first_checkpoint

VALIDATED = HERE / "ranks" / "validated.py"


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None, expect: int | None = 0):
    return mpiexec(3, "--storage", str(tmp_path), *args, script=VALIDATED, timeout=180,
                   env=env, expect=expect)


def _validations(tmp_path: Path, name: str = "val") -> Counter:
    """How many times each checkpoint was validated."""
    log = tmp_path / f"{name}-validations.log"
    return Counter(line.split()[0] for line in log.read_text().splitlines())


def _kept(tmp_path: Path, name: str = "val") -> dict[str, dict]:
    return {c["directory"]: c for c in manifest(tmp_path / name)["checkpoints"]}


@pytest.mark.alone  # it times the training loop
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
    # A kept checkpoint's report carries its validation's metrics, as Ray updates them in
    # place; an evicted checkpoint's validation is not kept.
    assert final["history"] == final["frame"] == [None, 11.0, None, 13.0], final
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


@pytest.mark.parametrize("set_aside", ["0", "1"], ids=["on-rank-0s-node", "on-a-rank-set-aside"])
def test_a_rank_killed_while_validating_leaves_it_pending_and_the_rerun_validates_once(
        tmp_path, set_aside):
    killed = _run(tmp_path, "--validate-seconds", "1", "--validation-ranks", set_aside,
                  env={"HPCKIT_FAULT": "validating:0:2"}, expect=None)
    assert killed.returncode != 0 and killed.line("FINAL") is None, killed.output
    state = reliability.check_experiment(tmp_path / "val", None)
    pending = [d for d, c in _kept(tmp_path).items()
               if c["validation"]["status"] == "PENDING_VALIDATION"]
    assert "checkpoint_000001" in pending, _kept(tmp_path)
    rerun = _run(tmp_path, "--validate-seconds", "1", "--validation-ranks", set_aside)
    reliability.check_experiment(tmp_path / "val", state)
    assert "that an earlier attempt left pending" in rerun.output, rerun.output
    kept = _kept(tmp_path)
    assert sorted(kept) == ["checkpoint_000001", "checkpoint_000003"], kept
    assert all(c["validation"]["status"] == "VALIDATED" for c in kept.values()), kept
    # Validated once each; the one killed as it started may have run twice, recorded once.
    counts = _validations(tmp_path)
    assert set(counts) == {f"checkpoint_00000{i}" for i in range(4)}, counts
    assert all(n == 1 for d, n in counts.items() if d != "checkpoint_000001"), counts


def test_each_validation_as_a_slurm_job_of_its_own_is_recorded_and_cancelled_at_its_timeout(
        tmp_path, slurm):
    # timeout_s counts from the job's start, its Python's start-up included: 5 s, against the
    # slow validation's 10 s.
    run = _run(tmp_path, "--validate-seconds", "0.5", "--faulty", "--timeout", "5",
               "--sbatch", "partition=test", "--sbatch", "job-name=val", env=slurm.env)
    assert "checkpoint_000001: VALIDATION_FAILED (RuntimeError: validation of epoch 1 failed " \
           "on purpose)" in run.output, run.output
    assert "checkpoint_000002: VALIDATION_TIMEOUT (took longer than timeout_s=5; stopped)" \
        in run.output, run.output
    assert all(c["validation"]["status"] == "VALIDATED" for c in _kept(tmp_path).values())
    jobs = {line.split()[0]: line.split()[2]
            for line in (tmp_path / "val-validations.log").read_text().splitlines()}
    assert sorted(jobs) == [f"checkpoint_00000{i}" for i in range(4)], jobs
    assert "-" not in jobs.values() and len(set(jobs.values())) == 4, jobs  # a job each
    states = {d: slurm.run("scontrol", "show", "job", "-o", j).stdout for d, j in jobs.items()}
    assert "JobState=CANCELLED" in states["checkpoint_000002"], states
    assert "JobName=val " in states["checkpoint_000000"] and \
        "JobState=COMPLETED" in states["checkpoint_000000"], states
    assert not (tmp_path / "val" / ".staging").exists(), "the jobs' folder outlived the run"


def test_ranks_set_aside_validate_in_parallel_and_return_the_runs_result(tmp_path):
    """4 ranks: 2 train, 2 validate; each validation takes longer than an epoch, so both
    validation ranks are busy at once."""
    run = mpiexec(4, "--storage", str(tmp_path), "--validate-seconds", "1.5",
                  "--validation-ranks", "2", "--wait", script=VALIDATED, timeout=180)
    pids = {int(rank): int(pid) for rank, pid in re.findall(r"PID (\d+) (\d+)", run.output)}
    lines = (tmp_path / "val-validations.log").read_text().splitlines()
    parents = Counter(int(line.split()[3]) for line in lines)
    assert set(parents) == {pids[2], pids[3]}, (parents, pids)  # the two ranks set aside
    assert _validations(tmp_path) == {f"checkpoint_00000{i}": 1 for i in range(4)}
    kept = _kept(tmp_path)
    assert sorted(kept) == ["checkpoint_000001", "checkpoint_000003"], kept
    assert all(c["validation"]["status"] == "VALIDATED" for c in kept.values()), kept
    assert json.loads(run.line("REPORTED")) == [
        ["checkpoint_000001", "VALIDATED", 11.0], ["checkpoint_000003", "VALIDATED", 13.0]]
    assert "SERVED 2 2" in run.output and "SERVED 3 2" in run.output, run.output



def test_a_stop_reaches_the_rank_set_aside_and_the_rerun_validates_what_was_pending(tmp_path):
    """The stop signal to every rank: the training ranks stop at their next report, and the
    rank set aside leaves with them (exit 75, not killed by the launcher); the rerun
    validates what the stop left pending."""
    command = [MPIEXEC, "-prepend-rank", "-n", "3", sys.executable, str(VALIDATED),
               "--storage", str(tmp_path), "--validate-seconds", "1", "--validation-ranks", "1",
               "--epochs", "6", "--epoch-seconds", "0.3"]
    (tmp_path / "pids").mkdir()
    stopped = stopped_after_first_checkpoint(command, tmp_path / "pids", {})
    assert "stop requested by SIGUSR2" in stopped, stopped
    assert manifest(tmp_path / "val")["attempts"][-1]["status"] == "stopped"
    rerun = mpiexec(3, "--storage", str(tmp_path), "--validate-seconds", "0.2",
                    "--validation-ranks", "1", "--epochs", "6", "--epoch-seconds", "0.05",
                    script=VALIDATED, timeout=180)
    assert rerun.line("FINAL") is not None, rerun.output
    kept = _kept(tmp_path)
    assert kept and all(c["validation"]["status"] == "VALIDATED" for c in kept.values()), kept


def test_hpckit_resume_starts_the_ranks_set_aside_too(tmp_path):
    # The manifest's world is the training ranks; the rank set aside to validate is launched
    # beside them, or every rank fails the world check.
    killed = _run(tmp_path, "--validate-seconds", "0.2", "--validation-ranks", "1",
                  "--epoch-seconds", "0.1", env={"HPCKIT_FAULT": "committed:0:2"}, expect=None)
    assert killed.returncode != 0 and killed.line("FINAL") is None, killed.output
    resumed = run([HPCKIT, "resume", str(tmp_path / "val")], 180)
    assert "with 2 rank(s) and 1 set aside to validate" in resumed.output, resumed.output
    assert resumed.line("SERVED 2") is not None, resumed.output
    attempts = manifest(tmp_path / "val")["attempts"]
    assert len(attempts) == 2 and attempts[-1]["status"] == "finished", attempts


@pytest.mark.quick
def test_a_rank_set_aside_answers_even_when_it_cannot_validate(tmp_path):
    """Rank 0 waits for an outcome from each validation it sends: one that cannot even start
    on the validation rank (its folder is gone) is answered as failed, naming the rank."""
    from types import SimpleNamespace

    from hpckit import Checkpoint, ValidationConfig
    from hpckit.experiment.manifest import FAILED, PENDING, Validation
    from hpckit.run.validation.pool import _answer

    pending = Validation(PENDING, {})
    link = SimpleNamespace(rank=3)  # never asked: the validation fails before any message
    for payload in (str(tmp_path / "gone"), OSError(28, "No space left on device")):
        ended = _answer(link, payload, ValidationConfig(len), Checkpoint.from_directory(tmp_path),
                        pending)
        assert ended is not None and ended.status == FAILED, ended
        assert ended.error.startswith("on validation rank 3: "), ended.error
