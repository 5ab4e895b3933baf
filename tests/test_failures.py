"""A failing rank stops every rank fast, with one error naming it; no hangs."""

from __future__ import annotations

import glob
import re
import sys

import pytest
from conftest import HERE, checkpoint_dirs, manifest, mpiexec, python
from support.scenarios import killed_once_and_restarted


def test_exception_in_one_rank_stops_all_ranks_and_names_it(tmp_path):
    run = mpiexec(3, "--storage", str(tmp_path), "--epochs", "4", "--fail-rank", "1",
                  "--fail-epoch", "2", expect=None, timeout=60)
    assert run.returncode != 0
    assert "rank 1 failed; aborting all 3 ranks" in run.output
    assert "ValueError: injected failure on rank 1 at epoch 2" in run.output
    assert 'File "' in run.output and "in train_loop" in run.output  # the traceback
    assert "run the same command again" in run.output
    exp = tmp_path / "exp"
    assert [c["directory"] for c in manifest(exp)["checkpoints"]] == [
        "checkpoint_000000", "checkpoint_000001"]


def test_spawned_run_raises_one_error_naming_the_rank_with_its_traceback(tmp_path):
    run = python("--workers", "3", "--storage", str(tmp_path), "--fail-rank", "2",
                 "--fail-epoch", "1", expect=3, timeout=90)
    error = run.line("ERROR")
    assert error and error.startswith("WorkerGroupError: training failed on rank 2")
    assert run.line("FAILED") == '{"2": "ValueError"}'  # worker_failures: rank 2's own
    assert "--- rank 2 ---" in run.output and "in train_loop" in run.output
    attempts = manifest(tmp_path / "exp")["attempts"]
    assert [a["status"] for a in attempts] == ["failed"]


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_that_reports_more_often_is_detected_on_every_rank(tmp_path, world):
    run = mpiexec(world, "--storage", str(tmp_path), "--epochs", "2",
                  "--extra-report-rank", str(world - 1), expect=3, timeout=60)
    # mpiexec forwards each rank's output in chunks, so lines of two ranks may be glued.
    failed = re.findall(rf"\[(\d+)\] ERROR WorkerGroupError: training failed on all {world} "
                        "ranks: ReportMismatchError", run.output)
    assert sorted(set(failed)) == [str(r) for r in range(world)], run.output
    # Every rank's worker_failures: the mismatch, found where the reports meet (rank 0's plan).
    assert re.findall(r"FAILED (\{[^}]*\})", run.output) == ['{"0": "ReportMismatchError"}'] * world
    assert f"rank {world - 1}: called report() for the 3rd time" in run.output
    assert "rank 0: returned from the training function after 2 report() call(s)" in run.output


def test_failure_config_restarts_and_resumes_from_last_checkpoint(tmp_path):
    run = python("--workers", "2", "--storage", str(tmp_path), "--epochs", "4",
                 "--fail-rank", "1", "--fail-epoch", "2", "--max-failures", "1", timeout=150)
    assert run.line("SEEN") == "[2, 3]"  # the restart resumed after epoch 1's checkpoint
    exp = tmp_path / "exp"
    m = manifest(exp)
    assert [a["status"] for a in m["attempts"]] == ["failed", "finished"]
    assert "injected failure on rank 1" in m["attempts"][0]["error"]
    assert m["latest"] == "checkpoint_000003"
    assert [r["epoch"] for r in run.result["history"]] == [0, 1, 2, 3]
    assert "restarting from the last committed checkpoint" in run.output


def test_failures_beyond_max_failures_give_up(tmp_path):
    run = python("--workers", "2", "--storage", str(tmp_path), "--epochs", "3", "--fail-rank", "0",
                 "--fail-epoch", "0", "--fail-attempts", "9", "--max-failures", "1",
                 expect=3, timeout=150)
    assert run.line("ERROR").startswith("WorkerGroupError: training failed on rank 0")
    assert [a["status"] for a in manifest(tmp_path / "exp")["attempts"]] == ["failed", "failed"]
    assert checkpoint_dirs(tmp_path / "exp") == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_refusal_a_restart_would_meet_again_is_not_restarted(tmp_path, workers):
    """Metrics that are not JSON are refused at every report from the same checkpoint on:
    FailureConfig(max_failures=3) spends no restart on them, in a single rank that restarts
    itself or under python train.py's launcher, and says why once."""
    run = python("--workers", str(workers), "--storage", str(tmp_path), "--metrics", "bad",
                 "--max-failures", "3", expect=3, timeout=90)
    assert "metric 'model'" in run.output, run.output
    assert [a["status"] for a in manifest(tmp_path / "exp")["attempts"]] == ["failed"]
    said = "not restarted: a restart from the last committed checkpoint would meet the same " \
           "MetricsError again"
    assert run.output.count(said) == 1, run.output
    assert "restarting from the last committed checkpoint" not in run.output


def test_single_rank_retries_in_process(tmp_path):
    run = python("--workers", "1", "--storage", str(tmp_path), "--epochs", "3", "--fail-rank", "0",
                 "--fail-epoch", "1", "--max-failures", "-1", timeout=90)
    assert run.line("SEEN") == "[1, 2]"
    assert [a["status"] for a in manifest(tmp_path / "exp")["attempts"]] == ["failed", "finished"]


@pytest.mark.alone  # compares /dev/shm before and after
def test_a_killed_rank_is_restarted_and_the_run_resumes(tmp_path):
    segments_before = set(glob.glob("/dev/shm/mpich_*"))
    returncode, output = killed_once_and_restarted(sys.executable, tmp_path, {})
    assert returncode == 0, output
    assert "SEEN [2, 3]" in output and "no rank reported an exception" in output
    m = manifest(tmp_path / "exp")
    assert [a["status"] for a in m["attempts"]] == ["failed", "finished"]
    assert m["latest"] == "checkpoint_000003"
    left = set(glob.glob("/dev/shm/mpich_*")) - segments_before
    assert not left, f"the killed attempt's shared memory is still in RAM: {left}"


def test_a_process_may_call_fit_again_after_hundreds_of_failed_ones(tmp_path):
    """Each in-process fit() frees the communicators it made, failed or not: before, the
    682nd failed fit() of one process ended it in MPICH's 'Too many communicators'."""
    done = python(str(tmp_path), "1000", script=HERE / "ranks" / "failing_fits.py", timeout=120,
                  env={"HPCKIT_LOG_LEVEL": "CRITICAL", "HPCKIT_TENSORBOARD": "0"})
    assert done.line("DONE") == "1000", done.output[-3000:]
