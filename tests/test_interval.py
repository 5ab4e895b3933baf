"""get_context().should_checkpoint(): Young/Daly's interval from the measured blocking cost
and CheckpointConfig(mtbf_s), one answer on every rank, always True at a stop request."""

from __future__ import annotations

import math
import re
import sys

import pytest
from conftest import manifest, run

from hpckit import CheckpointConfig
from hpckit.errors import ConfigError
from hpckit.run.session.session import CheckpointClock, optimal_interval

pytestmark = pytest.mark.quick

ASKS_EACH_STEP = """
import os, signal, sys, tempfile, time
import hpckit
from hpckit import (Checkpoint, CheckpointConfig, DataParallelTrainer, PreemptionError,
                    RunConfig, ScalingConfig)

def loop(config):
    ctx = hpckit.get_context()
    for step in range(6):
        if ctx.get_world_rank() == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGUSR2)  # as Slurm's warning would
            time.sleep(0.1)
        due = ctx.should_checkpoint()
        print(f"DUE {ctx.get_world_rank()} {step} {due} END", flush=True)
        if due:
            with tempfile.TemporaryDirectory() as d:
                hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
        else:
            hpckit.report({"step": step})

try:
    DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=3), run_config=RunConfig(
        name="due", storage_path=sys.argv[1],
        checkpoint_config=CheckpointConfig(mtbf_s=1e9))).fit()
except PreemptionError:
    print("STOPPED", flush=True)
"""


def test_every_rank_gets_one_answer_due_first_then_by_the_interval_and_at_a_stop(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ASKS_EACH_STEP)
    out = run([sys.executable, str(script), str(tmp_path)], timeout=120, expect=None)
    assert "STOPPED" in out.output, out.output
    seen: dict[int, list[tuple[int, bool]]] = {}
    for rank, step, due in re.findall(r"DUE (\d) (\d) (True|False) END", out.output):
        seen.setdefault(int(rank), []).append((int(step), due == "True"))
    # Due before anything was measured; not within the interval (MTBF 1e9 s: hours); due
    # at the step where rank 1 alone received the stop signal, on every rank alike.
    expected = [(0, True), (1, False), (2, False), (3, True)]
    assert seen == {0: expected, 1: expected, 2: expected}, out.output
    assert re.search(r"checkpoint interval \d+ s \(Young/Daly: blocking cost", out.output)
    committed = [c["directory"] for c in manifest(tmp_path / "due")["checkpoints"]]
    assert committed == ["checkpoint_000000", "checkpoint_000001"], committed


ASKED_ON_RANK_0_ALONE = """
import sys
import hpckit
from hpckit import DataParallelTrainer, ReportMismatchError, RunConfig, ScalingConfig

def loop(config):
    ctx = hpckit.get_context()
    if ctx.get_world_rank() == 0 and ctx.should_checkpoint():
        pass
    hpckit.report({"step": 0})

try:
    DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(
        name="alone", storage_path=sys.argv[1])).fit()
except hpckit.TrainingFailedError as exc:
    print("CAUGHT", type(exc.worker_failures[0]).__name__, exc.worker_failures[0], "END")
"""


def test_asking_on_one_rank_alone_is_a_clear_mismatch_on_every_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ASKED_ON_RANK_0_ALONE)
    out = run([sys.executable, str(script), str(tmp_path)], timeout=120, expect=None)
    assert re.search(r"CAUGHT ReportMismatchError rank\(s\) 1 made another collective call "
                     r"where the others called get_context\(\)\.should_checkpoint\(\)",
                     out.output), out.output


def test_the_clock_measures_the_median_blocking_cost_and_times_the_interval():
    clock = CheckpointClock(mtbf_s=1e6)
    assert clock.due() == (True, None)  # nothing measured yet
    for blocked in (0.9, 0.5, 0.1):
        clock.reported(blocked)
    clock.reported(None)  # a report without a checkpoint measures nothing
    due, interval = clock.due()
    assert not due and interval == pytest.approx(math.sqrt(2 * 0.5 * 1e6))


def test_the_checkpoint_is_due_once_the_interval_has_passed():
    clock = CheckpointClock(mtbf_s=3600)
    clock.reported(1.0)
    assert clock.due() == (False, pytest.approx(84.85, abs=0.01))
    clock.committed_at -= 85  # as if 85 s had passed since that checkpoint
    assert clock.due()[0] is True


def test_the_interval_is_young_and_dalys():
    assert optimal_interval(10, 86400) == pytest.approx(1314.53, abs=0.01)
    assert optimal_interval(60, 3600) == pytest.approx(657.27, abs=0.01)


@pytest.mark.parametrize("bad", [0, -5, "86400", True])
def test_mtbf_must_be_a_positive_number_of_seconds(bad):
    with pytest.raises(ConfigError, match=r"mtbf_s=.* is invalid: use the job's mean time"):
        CheckpointConfig(mtbf_s=bad)
