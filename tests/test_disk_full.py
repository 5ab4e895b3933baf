"""A checkpoint that fills the disk fails on every rank, saying so and where; what was
committed stays intact, and training continues once there is space again."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from support import reliability
from conftest import HERE, checkpoint_dirs, mpiexec

SHARDED = HERE / "ranks" / "sharded.py"
SHARD = "65536"  # 512 KiB per file: a checkpoint of three ranks takes 3 MiB


def sharded(storage, epochs: int, expect: int | None = 0):
    return mpiexec(3, "--storage", str(storage), "--epochs", str(epochs), "--keep", "10",
                   "--shard-floats", SHARD, script=SHARDED, expect=expect, timeout=90)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs: room for two checkpoints, not three."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): "
                    f"{mounted.stderr.strip()}")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def test_a_full_disk_fails_the_report_everywhere_and_loses_nothing(small_disk, tmp_path):
    reference = json.loads(sharded(tmp_path / "reference", 5).line("FINAL"))
    out = sharded(small_disk, 5, expect=None)
    text = re.sub(r"\[\d+\] ", "", out.output)
    assert out.returncode != 0 and out.line("FINAL") is None
    assert re.search(r"CommitError.*persisting checkpoint_000002 failed on rank [0-9, ]+: .*disk is "
                     rf"full \(No space left on device\).*{small_disk}", text, re.S), text
    # Non-greedy: two ranks' lines can arrive joined on one output line.
    raised = re.findall(r"RAISED .*?CommitError: persisting checkpoint_000002 failed", out.output)
    assert len(raised) >= 3, f"not every one of the 3 ranks raised the error:\n{out.output}"
    exp = small_disk / "exp"
    state = reliability.check_experiment(exp, reliability.reported(exp))
    assert state.latest == "checkpoint_000001" and state.committed == ["checkpoint_000000",
                                                                       "checkpoint_000001"]
    assert checkpoint_dirs(exp) == state.committed, "the failed checkpoint was not cleaned up"

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    resumed = sharded(small_disk, 5)
    assert re.search(r"resuming experiment \S+ from checkpoint_000001", resumed.output)
    assert json.loads(resumed.line("FINAL")) == reference
    end = reliability.check_experiment(exp, state)
    reliability.record("disk full", "tmpfs of 8 MiB", "report failed on every rank",
                       lost=len(end.lost))
    assert not end.lost, f"committed checkpoints that retention keeps were lost: {end.lost}"
