"""Slurm jobs for the tests that submit them to the one-node Slurm (the ``slurm`` fixture):
the sbatch script a user writes and its submission, waiting for a job to end or for its
reports, and what its tasks printed."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HERE, metrics_lines

SLOW_START = HERE / "ranks" / "slow_start.py"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def minimal_script(tmp_path: Path, ntasks: int, command: str) -> Path:
    """The sbatch script a user writes: no hpckit template, no step-id tricks."""
    script = tmp_path / "train.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --ntasks={ntasks}\n#SBATCH --requeue\n"
                      f"srun {command}\n")
    return script


def sbatch(slurm, tmp_path: Path, script: Path, *options: str, **env: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}",
                          f"--output={tmp_path}/job-%j.out", "--open-mode=append",
                          "--cpus-per-task=1", *options, str(script)],
                         env={**slurm.env, **env}, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def states(slurm, job: str) -> dict[str, str]:
    """Job (or array task) id -> JobState."""
    out = slurm.run("scontrol", "show", "job", "-o", job, check=False)
    found = {}
    for line in out.stdout.splitlines():
        ident = re.search(r"JobId=(\d+)", line).group(1)
        task = re.search(r"ArrayTaskId=(\S+)", line)
        found[f"{ident}_{task.group(1)}" if task else ident] = re.search(r"JobState=(\S+)", line).group(1)
    return found


POLL_S = 0.2  # scontrol answers in milliseconds; a job's end is seen within this


def wait(slurm, tmp_path: Path, job: str, timeout: float) -> dict[str, str]:
    """Until every task of ``job`` has ended; their states."""
    deadline = time.monotonic() + timeout
    while True:
        found = states(slurm, job)
        if found and all(s in TERMINAL for s in found.values()):
            return found
        slurm.hurry(job)
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name} ---\n{p.read_text()}" for p in tmp_path.glob("*.out"))
            slurm.run("scancel", job, check=False)
            pytest.fail(f"job {job} still {found} after {timeout:.0f} s\n{logs}\n{slurm.logs()}")
        time.sleep(POLL_S)


def wait_for_reports(slurm, tmp_path: Path, experiment: Path, count: int, timeout: float) -> None:
    """Until the running job has logged ``count`` reports (then it is mid-run)."""
    deadline = time.monotonic() + timeout
    while not (experiment / "metrics.jsonl").exists() or len(metrics_lines(experiment)) < count:
        assert time.monotonic() < deadline, output_of(tmp_path) + slurm.logs()
        time.sleep(POLL_S)


def output_of(tmp_path: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("*.out")))
