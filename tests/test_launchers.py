"""How a rank tells its launcher and MPI, what the launching side advises, and the world it accepts."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from hpckit.run.mpi.library import implementation, loaded_version, srun_plugin
from hpckit.settings import Settings

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("environ,launcher,tasks", [
    ({}, None, None),
    ({"PMI_SIZE": "3", "PMI_RANK": "0"}, "mpiexec", 3),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "mpiexec", 2),
    ({"SLURM_STEP_NUM_TASKS": "4", "PMI_SIZE": "4"}, "srun", 4),
    ({"SLURM_STEP_NUM_TASKS": "2", "PMIX_RANK": "1"}, "srun", 2),  # srun --mpi=pmix
    ({"SLURM_STEP_NUM_TASKS": "1", "OMPI_COMM_WORLD_SIZE": "3", "PMIX_RANK": "0"}, "mpiexec", 3),
    ({"SLURM_STEP_NUM_TASKS": "3"}, "srun", 3),
    ({"SLURM_STEP_NUM_TASKS": "1", "PMI_SIZE": "2"}, "mpiexec", 2),
    ({"SLURM_JOB_ID": "7"}, None, None),
])
def test_launcher_detection(environ, launcher, tasks):
    env = Settings.read(environ)
    assert env.launcher == launcher and env.launched_tasks == tasks


@pytest.mark.parametrize("version,plugin", [
    ("MPICH Version:      4.3.2", "pmi2"),
    ("Open MPI v5.0.11, package: Open MPI root@build Distribution", "pmix"),
    ("Intel(R) MPI Library 2021.17 for Linux* OS", "pmi2"),
    ("MPI VERSION    : CRAY MPICH version 8.1.30.2", "cray_shasta"),
    ("Some other MPI 1.0", "pmi2"),  # not recognised: the default
])
def test_srun_plugin_follows_the_mpi_implementation(version, plugin):
    assert srun_plugin(version) == plugin


def test_the_loaded_mpi_is_asked_without_starting_mpi_here():
    version = loaded_version(sys.executable)
    assert implementation(version) == "MPICH" and ", package:" not in version, version
    out = subprocess.run([sys.executable, "-m", "hpckit", "doctor", "--srun-mpi"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "pmi2\n", out.stdout + out.stderr


def test_finalize_with_hydra_speaks_pmi_1_only_to_hydra(monkeypatch):
    """Slurm's PMI-2 also sets PMI_FD, and a job submitted from an mpiexec rank inherits
    hydra's MPI_LOCALRANKID: PMI-1's words go only where hydra's proxy holds the other end."""
    from hpckit.run.ending.exit import finalize_with_hydra, hydra_connection

    ours, theirs = socket.socketpair()  # this process at both ends: not hydra_pmi_proxy
    try:
        monkeypatch.setenv("PMI_FD", str(theirs.fileno()))
        monkeypatch.setenv("MPI_LOCALRANKID", "0")
        assert hydra_connection() is None
        assert not finalize_with_hydra()
        ours.setblocking(False)
        with pytest.raises(BlockingIOError):
            ours.recv(64)
        monkeypatch.setenv("PMI_FD", "not a number")
        assert hydra_connection() is None
    finally:
        ours.close()
        theirs.close()


def test_a_slurm_warning_after_the_run_is_ignored_through_the_interpreter_exit():
    """Caught early (at import hpckit), then handled by a run: afterwards the warning is
    ignored, not caught, since Python resets caught signals to their default (terminate)
    when it finalizes, and Slurm's warning may come while the rank exits."""
    import signal

    from hpckit.run.ending import stop

    before = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        assert stop.catch_early(signal.SIGUSR2)
        with stop.handling(signal.SIGUSR2):
            assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        with stop.handling(signal.SIGUSR1):
            pass
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, before)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_ranks_set_aside_to_validate_are_counted_in_the_launch():
    from hpckit import ScalingConfig
    from hpckit.errors import LaunchError
    from hpckit.run.ranks import check_world

    check_world(4, ScalingConfig(num_workers=3), 1, None)
    with pytest.raises(LaunchError, match=r"num_workers=3\) and ValidationConfig\(ranks=1\) "
                                          r"but 3 rank\(s\) were launched; make them agree "
                                          r"\(mpirun -n 4"):
        check_world(3, ScalingConfig(num_workers=3), 1, None)


def test_an_elastic_run_takes_any_world_within_its_range_and_names_the_nearest_end():
    from hpckit import ScalingConfig
    from hpckit.errors import LaunchError
    from hpckit.run.ranks import check_world

    elastic = ScalingConfig(num_workers=(2, 4))
    for size in (2, 3, 4):
        check_world(size, elastic, 0, None)
    for size, nearest in ((1, 2), (5, 4)):
        with pytest.raises(LaunchError, match=rf"num_workers=\(2, 4\)\) but {size} rank\(s\) "
                                              rf"were launched; .*mpirun -n {nearest} "):
            check_world(size, elastic, 0, None)
    assert (elastic.min_workers, elastic.max_workers, elastic.elastic) == (2, 4, True)
    fixed = ScalingConfig(num_workers=(3, 3))
    assert (fixed.min_workers, fixed.max_workers, fixed.elastic) == (3, 3, False)
    assert ScalingConfig(num_workers=[1, 2]).num_workers == (1, 2)  # as a JSON config gives it


def test_the_no_spare_advice_says_a_new_job_resumes_only_an_experiment_the_user_named():
    from hpckit.launch.steps import how_to_continue

    named = how_to_continue("42", "/runs/resnet", named=True)
    assert "submit it again: it resumes" in named and "scontrol requeue 42" in named
    default = how_to_continue("42", "/runs/train-job42", named=False)
    assert "submit it again: it resumes" not in default
    assert "hpckit resume /runs/train-job42 --sbatch" in default
    assert "scontrol requeue 42" in default


def test_a_slow_import_of_torch_is_told_to_forward_an_early_stop_signal():
    """The advice for a slow shared filesystem gives the batch-shell signal with the trap that
    forwards it: --signal=B:... alone reaches the batch script, never the ranks."""
    from hpckit.doctor import SLOW_IMPORT_S, torch_build

    build, timing = torch_build([{"version": "2.13.0", "cuda": None,
                                  "import_s": SLOW_IMPORT_S + 1}])
    assert build.status == "ok" and timing.status == "warn"
    assert "@300 rather than @120 in #SBATCH --signal" in timing.fix
