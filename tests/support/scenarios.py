"""Scenarios that several test modules run, each under its own MPI (MPICH, Open MPI, Intel
MPI): a whole test body that starts the ranks and asserts, given the ``python`` to run and
the environment. Also the check that another MPI's virtualenv is there."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import JOB, STEADY, final_params, manifest, metrics_lines, run
from support.processes import descendants, ended_at_exit
from support.slurm_jobs import minimal_script, output_of, sbatch, wait

from hpckit.experiment.lock import LOCK_NAME
from hpckit.processes import alive


def require_mpi_venv(venv: Path, says: str) -> None:
    """The virtualenv of another MPI, whose mpiexec's version names it (``says``): CI fails
    without it, a developer's run skips."""
    if not (venv / "bin" / "python").exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must test {says}, but {venv} is missing; run .ci/install")
        pytest.skip(f"{venv} is missing (.ci/install builds it)")
    out = subprocess.run([str(venv / "bin" / "mpiexec"), "--version"], capture_output=True,
                         text=True, timeout=30)
    assert says in out.stdout, out.stdout


def srun_requeues_after_the_stop_signal(tmp_path: Path, slurm, python: Path, plugin: str,
                                        env: dict[str, str], reference: list[float]) -> None:
    """A minimal sbatch script whose ``srun --mpi=PLUGIN`` runs two ranks of another MPI's
    ``python``; the stop signal after the second checkpoint requeues the job, which finishes
    with the parameters of an uninterrupted MPICH run (``reference``)."""
    command = (f"--mpi={plugin} {python} {STEADY} --storage {tmp_path} --name other "
               "--workers 2 --epoch-seconds 1")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=10", **env)
    deadline = time.monotonic() + 120
    while not (tmp_path / "other" / "checkpoint_000001").exists():
        assert time.monotonic() < deadline, output_of(tmp_path) + slurm.logs()
        time.sleep(0.2)
    slurm.run("scancel", "--signal=USR2", job)
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    attempts = manifest(tmp_path / "other")["attempts"]
    assert [a["status"] for a in attempts] == ["requeued", "finished"], attempts
    assert attempts[0]["world_size"] == 2 and attempts[0]["launcher"] == "srun"
    assert final_params(output_of(tmp_path)) == reference


def wait_for_epochs(experiment: Path, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while not (experiment / "metrics.jsonl").exists() or len(metrics_lines(experiment)) < count:
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "training never reached the epoch"
        time.sleep(0.2)


def driver_killed_then_rerun(tmp_path: Path, reference: list[float], python: str,
                             env: dict[str, str], stop_signal: str) -> None:
    """Kill the driver of a 2-rank run after 2 epochs of 4 s (without the stop, the ranks
    would train on for 20 s more); check that nothing it started outlives it by 15 s, that
    the ranks stopped at a committed checkpoint, and that a rerun finishes as ``reference``."""
    command = [python, str(STEADY), "--workers", "2", "--storage", str(tmp_path),
               "--name", "k", "--epoch-seconds"]
    process = subprocess.Popen([*command, "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, env={**os.environ, **env})
    launched: list[int] = []
    try:
        wait_for_epochs(tmp_path / "k", 2, process)
        launched = descendants(process.pid)  # mpiexec, its proxy and the two ranks
        process.kill()
        deadline = time.monotonic() + 15
        try:
            output, _ = process.communicate(timeout=15)  # closed as the last rank exits
        except subprocess.TimeoutExpired:
            output = "(a rank or mpiexec still held the output 15 s after the driver died)"
        while [p for p in launched if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in launched if alive(p)]
    finally:
        for pid in launched:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert len(launched) >= 3 and left == [], f"still running: {left}\n{output}"
    assert f"stop requested ({stop_signal})" in output, output
    m = manifest(tmp_path / "k")
    assert m["attempts"][-1]["status"] == "stopped" and m["latest"] is not None, output
    assert not (tmp_path / "k" / LOCK_NAME).exists(), "the ranks kept the experiment locked"
    out = run([*command, "0"], timeout=120, env=env)
    assert final_params(out.output) == reference
    assert [line["metrics"]["epoch"] for line in metrics_lines(tmp_path / "k")] == list(range(8))


def killed_once_and_restarted(python: str, tmp_path: Path,
                              env: dict[str, str]) -> tuple[int, str]:
    """``python job.py --workers 3 --max-failures 1`` whose rank 1 hangs at epoch 2 and is
    SIGKILLed there; the exit status and output once the restarted attempt has ended."""
    marker = tmp_path / "hanging"
    process = subprocess.Popen(
        [python, str(JOB), "--workers", "3", "--storage", str(tmp_path), "--epochs", "4",
         "--hang-rank", "1", "--hang-epoch", "2", "--hang-file", str(marker), "--max-failures", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, **env})
    with ended_at_exit(process):
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
            time.sleep(0.1)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        output, _ = process.communicate(timeout=120)
    return process.returncode, output
