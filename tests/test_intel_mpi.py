"""A third MPI: Intel MPI from the ``impi-rt`` wheel, in a virtualenv of its own (.ci/install
builds ``.venv-impi``), for a representative subset of the scenarios that test_openmpi.py
runs: hpckit starting Intel MPI's ranks and resuming, a rank killed mid-checkpoint, the
driver killed, and ``srun --mpi=pmi2`` requeueing after the stop signal. Intel MPI is an
MPICH derivative (its Hydra launcher, PMI-2 under srun), so the rest is MPICH's ground."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import reliability
from conftest import HERE, manifest, run
from support.scenarios import driver_killed_then_rerun, require_mpi_venv, srun_requeues_after_the_stop_signal

VENV = Path(os.environ.get("HPCKIT_TEST_IMPI_VENV", HERE.parent / ".venv-impi"))
PYTHON, MPIEXEC = VENV / "bin" / "python", VENV / "bin" / "mpiexec"
SHARDED, STEADY = HERE / "ranks" / "sharded.py", HERE / "ranks" / "steady.py"
QUIET = {"HPCKIT_TENSORBOARD": "0"}


@pytest.fixture(scope="module", autouse=True)
def intel_mpi() -> None:
    require_mpi_venv(VENV, "Intel(R) MPI")


def test_job_scripts_are_told_to_start_intel_mpi_ranks_with_pmi2():
    out = subprocess.run([str(PYTHON), "-m", "hpckit", "doctor", "--srun-mpi"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "pmi2\n", out.stdout + out.stderr


def test_python_train_py_starts_intel_mpi_ranks_and_a_rerun_resumes(tmp_path):
    command = [str(PYTHON), str(STEADY), "--workers", "3", "--storage", str(tmp_path), "--name",
               "impi", "--epochs"]
    run([*command, "2"], 180, QUIET)
    assert manifest(tmp_path / "impi")["attempts"][0]["world_size"] == 3
    again = run([*command, "4"], 180, QUIET)
    assert "from checkpoint_000001" in again.output, again.output
    assert again.output.count("FINAL ") == 1, again.output  # the script's end runs once
    assert manifest(tmp_path / "impi")["latest"] == "checkpoint_000003"


def test_a_rank_killed_mid_checkpoint_loses_nothing_and_the_rerun_is_exact(tmp_path):
    def sharded(storage: Path, env: dict[str, str], expect: int | None = 0):
        return run([str(MPIEXEC), "-n", "3", str(PYTHON), str(SHARDED), "--storage",
                    str(storage), "--epochs", "10"], 120, {**QUIET, **env}, expect)

    reference = sharded(tmp_path / "ref", {})  # the world's gather; the others, node leaders'
    killed = sharded(tmp_path, {"HPCKIT_FAULT": "written:1:3", "HPCKIT_RANKS_PER_NODE": "2"},
                     expect=None)
    assert killed.returncode != 0 and killed.line("FINAL") is None, killed.output
    state = reliability.check_experiment(tmp_path / "exp", None)
    rerun = sharded(tmp_path, {"HPCKIT_RANKS_PER_NODE": "1"})
    reliability.check_experiment(tmp_path / "exp", state)
    assert json.loads(rerun.line("FINAL")) == json.loads(reference.line("FINAL"))


def test_ranks_stop_when_their_driver_is_killed_and_the_rerun_resumes(tmp_path, steady_reference):
    driver_killed_then_rerun(tmp_path, steady_reference, str(PYTHON), QUIET, "SIGTERM")


def test_srun_with_pmi2_trains_and_requeues_after_the_stop_signal(tmp_path, slurm,
                                                                  steady_reference):
    # Intel MPI's own PMI-2 client: no I_MPI_PMI_LIBRARY (with Slurm's libpmi2 or libpmix
    # named there, these ranks hung in MPI_Init; docs/site.md says so).
    srun_requeues_after_the_stop_signal(tmp_path, slurm, PYTHON, "pmi2", QUIET,
                                        steady_reference)
