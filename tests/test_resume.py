"""Resume: after a killed run, from a manifest, and from a given checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import JOB, MPIEXEC, checkpoint_dirs, manifest, metrics_lines, mpiexec, python
from support.processes import ended_at_exit


def _start_and_kill_rank(tmp_path, n: int, kill_rank: int, epoch: int) -> None:
    """Start ``n`` ranks; when ``kill_rank`` reaches ``epoch``, SIGKILL it. Returns when all died."""
    marker = tmp_path / "hanging"
    process = subprocess.Popen(
        [MPIEXEC, "-n", str(n), sys.executable, str(JOB), "--storage", str(tmp_path / "runs"),
         "--epochs", "5", "--checkpoint", "shards", "--hang-rank", str(kill_rank),
         "--hang-epoch", str(epoch), "--hang-file", str(marker)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    with ended_at_exit(process):
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the rank never reached the epoch to kill it at"
            time.sleep(0.1)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        output, _ = process.communicate(timeout=60)
        assert process.returncode != 0, output


@pytest.mark.parametrize("world", [1, 2, 3])
def test_killed_run_resumes_from_last_committed_checkpoint(tmp_path, world):
    _start_and_kill_rank(tmp_path, world, kill_rank=world - 1, epoch=2)
    exp = tmp_path / "runs" / "exp"
    assert manifest(exp)["latest"] == "checkpoint_000001"
    # What a commit interrupted by the kill would have left behind:
    (exp / "checkpoint_000002").mkdir()
    (exp / "checkpoint_000002" / "model-rank=0.pt").write_bytes(b"partial")
    (exp / ".manifest.json.tmp-deadbeef").write_text("{")

    run = mpiexec(world, "--storage", str(tmp_path / "runs"), "--epochs", "5",
                  "--checkpoint", "shards")
    assert run.line("SEEN") == "[2, 3, 4]"
    m = manifest(exp)
    assert [c["directory"] for c in m["checkpoints"]] == [f"checkpoint_00000{i}" for i in range(5)]
    assert not (exp / ".manifest.json.tmp-deadbeef").exists()
    assert (exp / "checkpoint_000002" / "model-rank=0.pt").read_bytes() == bytes([0]) * 1000
    assert [line["step"] for line in metrics_lines(exp)] == [0, 1, 2, 3, 4]
    assert [a["status"] for a in m["attempts"]] == ["interrupted", "finished"]
    assert [a.get("resumed_from") for a in m["attempts"]] == [None, "checkpoint_000001"]
    assert "removed leftovers" in run.output


def test_resume_from_checkpoint_seeds_a_new_experiment(tmp_path):
    python("--storage", str(tmp_path), "--name", "first", "--epochs", "2")
    seed = tmp_path / "first" / "checkpoint_000001"
    run = python("--storage", str(tmp_path), "--name", "second", "--epochs", "4",
                 "--resume-from", str(seed))
    assert run.line("SEEN") == "[2, 3]"
    m = manifest(tmp_path / "second")
    assert [c["directory"] for c in m["checkpoints"]] == ["checkpoint_000000", "checkpoint_000001"]
    assert m["config"]["resume_from_checkpoint"] == str(seed)


def test_rerunning_a_finished_experiment_continues_its_numbering(tmp_path):
    python("--storage", str(tmp_path), "--epochs", "2", "--workers", "2")
    run = python("--storage", str(tmp_path), "--epochs", "3", "--workers", "2")
    assert run.line("SEEN") == "[2]"
    assert checkpoint_dirs(tmp_path / "exp") == ["checkpoint_000000", "checkpoint_000001",
                                                 "checkpoint_000002"]


@pytest.mark.parametrize("every_rank_saves", [False, True])
def test_an_elastic_restart_on_fewer_ranks_is_refused_in_one_line_where_ranks_wrote_shards(
        tmp_path, every_rank_saves):
    """What an elastic run asks before it starts again on another number of ranks, of a
    2-rank run's manifest: rank 0's files load on one rank; per-rank shards are refused with
    the checkpoint, the writers and both ways to go on."""
    from conftest import HPCKIT, HERE, run

    from hpckit.launch.elastic import refusal
    from hpckit.storage.location import resolve

    extra = ["--every-rank-saves"] if every_rank_saves else []
    run([HPCKIT, "run", "-n", "2", str(HERE / "ranks" / "steady.py"), "--storage", str(tmp_path),
         "--name", "e", "--epochs", "1", *extra], timeout=120)
    said = refusal(resolve(str(tmp_path / "e")), 0, 1)
    if not every_rank_saves:
        assert said is None
        return
    assert said is not None and "\n" not in said, said
    assert said.startswith("the elastic restart on 1 rank(s) differs from the recorded world "
                           "size 2, but checkpoint_000000 holds files written by ranks [0, 1]"), said
    assert "Keep 2 rank(s) with a spare node, or ScalingConfig(num_workers=2)" in said, said
    assert "save_state_dcp" in said, said
