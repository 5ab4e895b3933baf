"""FailureConfig(hang_timeout_s): a rank stuck in a collective, and a deadlocked data loader,
end the attempt as hung with every rank's stacks kept; the run restarts as max_failures
allows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import mpiexec, run

from hpckit import FailureConfig
from hpckit.errors import ConfigError

# The watchdog's 5 s is a hundred times what a report of these loops takes, and its clock
# starts with the training function, after the ranks' start-up: a test beside it slows them
# by twice at most, so these run two at a time.

STUCK_IN_A_COLLECTIVE = """
import os, sys, tempfile
import hpckit
from hpckit import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

def loop(config):
    rank = hpckit.get_context().get_world_rank()
    start = 0
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, 3):
        marker = os.path.join(config["storage"], "stuck-once")
        if rank == 1 and step == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            from mpi4py import MPI
            MPI.COMM_WORLD.barrier()  # that rank 0 never enters: it waits in report()
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d))

DataParallelTrainer(loop, train_loop_config={"storage": sys.argv[1]},
                    scaling_config=ScalingConfig(num_workers=2),
                    run_config=RunConfig(name="stuck", storage_path=sys.argv[1],
                                         failure_config=FailureConfig(max_failures=1,
                                                                      hang_timeout_s=5))).fit()
print("FINISHED")
"""

DEADLOCKED_LOADER = """
import sys, threading
import torch
import hpckit
from hpckit import DataParallelTrainer, FailureConfig, RunConfig

class Deadlocked(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        threading.Event().wait()  # a lock that is never released

def loop(config):
    hpckit.report({"step": 0})
    for batch in torch.utils.data.DataLoader(Deadlocked(), num_workers=1):
        hpckit.report({"step": 1})

DataParallelTrainer(loop, run_config=RunConfig(
    name="loader", storage_path=sys.argv[1],
    failure_config=FailureConfig(hang_timeout_s=5))).fit()
"""


FINISHES_THEN_WAITS = """
import sys, time
import hpckit
from hpckit import DataParallelTrainer, FailureConfig, RunConfig

def loop(config):
    hpckit.report({"step": 0})

DataParallelTrainer(loop, run_config=RunConfig(
    name="done", storage_path=sys.argv[1], failure_config=FailureConfig(hang_timeout_s=1))).fit()
time.sleep(3)
print("STILL HERE")
"""


def _line_of(text: str, code: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if code in line)


def _script(tmp_path: Path, text: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(text)
    return str(script)


def test_a_rank_stuck_in_a_collective_ends_the_attempt_as_hung_and_it_restarts(tmp_path):
    out = run([sys.executable, _script(tmp_path, STUCK_IN_A_COLLECTIVE), str(tmp_path)],
              timeout=120)
    assert "FINISHED" in out.output and "no report() completed within 5 s" in out.output
    experiment = tmp_path / "stuck"
    attempts = json.loads((experiment / "manifest.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["hung", "finished"], attempts
    assert attempts[0]["error"].startswith("hung: no report() completed"), attempts
    stuck = (experiment / "logs" / "hang-attempt0-rank1.txt").read_text()
    waiting = (experiment / "logs" / "hang-attempt0-rank0.txt").read_text()
    barrier = _line_of(STUCK_IN_A_COLLECTIVE, "MPI.COMM_WORLD.barrier()")
    assert f'train.py", line {barrier} in loop' in stuck, stuck  # where it is stuck
    assert "in report" in waiting, waiting  # rank 0 waits for it
    steps = [json.loads(line)["metrics"]["step"]
             for line in (experiment / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2], steps


def test_under_mpirun_the_job_ends_and_the_next_run_records_the_attempt_as_hung(tmp_path):
    script = Path(_script(tmp_path, STUCK_IN_A_COLLECTIVE))
    hung = mpiexec(2, str(tmp_path), script=script, timeout=120, expect=None)
    # Nobody restarts ranks that mpirun started: the job ends. Each rank ends itself with 124;
    # MPICH's mpiexec kills the others once one ended, and reports 9 where it killed one
    # before it ended itself (ci32, beside the 64-rank test).
    assert hung.returncode in (124, 9), hung.output
    assert "no report() completed within 5 s" in hung.output, hung.output
    mpiexec(2, str(tmp_path), script=script, timeout=120)
    attempts = json.loads((tmp_path / "stuck" / "manifest.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["hung", "finished"], attempts


def test_a_deadlocked_data_loader_ends_the_rank_with_its_stacks(tmp_path):
    out = run([sys.executable, _script(tmp_path, DEADLOCKED_LOADER), str(tmp_path)],
              timeout=120, expect=124)
    assert "no report() completed within 5 s" in out.output, out.output
    stacks = (tmp_path / "loader" / "logs" / "hang-attempt0-rank0.txt").read_text()
    assert "dataloader.py" in stacks and "in loop" in stacks, stacks


@pytest.mark.alone  # a timeout of 1 s
def test_a_run_that_ends_leaves_no_watch_behind(tmp_path):
    # The watch (and faulthandler's backstop) stop with the training function: the program
    # goes on well past the timeout after fit() and ends normally.
    script = _script(tmp_path, FINISHES_THEN_WAITS)
    out = run([sys.executable, script, str(tmp_path)], timeout=60)
    assert "STILL HERE" in out.output and "no report() completed" not in out.output


@pytest.mark.parametrize("bad", [0, -1, "60", True])
def test_hang_timeout_must_be_a_positive_number_of_seconds(bad):
    with pytest.raises(ConfigError, match=r"hang_timeout_s=.* is invalid: use a number of seconds"):
        FailureConfig(hang_timeout_s=bad)
