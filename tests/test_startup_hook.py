"""The stop signal in the first moments of a rank, before ``import hpckit``: the start-up hook
(hpckit-early.pth, ``hpckit/run/startup/hook.py``) notes it from the script's first line, and
hpckit takes it over. A plain sbatch script whose ranks import torch first and get Slurm's
warning 0.3 s after they start ends COMPLETED, every update applied once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from conftest import MPIEXEC, STEADY, final_params, manifest, run
from support.slurm_jobs import minimal_script, output_of, sbatch, wait

HOOK = Path(sysconfig.get_paths()["purelib"]) / "hpckit-early.pth"
SIGNAL_THEN_IMPORT = """
import os, signal, time
os.kill(os.getpid(), signal.SIGUSR2)   # before anything of hpckit (or torch) is imported
time.sleep(0.2)
import hpckit
from hpckit.run.ending import stop
print("RECEIVED", stop.received())
"""


@pytest.fixture(autouse=True)
def hook_installed():
    if not HOOK.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{HOOK} is missing: pip install -e . puts it there (setup.py)")
        pytest.skip(f"{HOOK} is missing (pip install -e . puts it there)")


@pytest.fixture(autouse=True)
def default_stop_signal():
    """The children start with SIGUSR2's default, as a rank does: a run of fit() inside this
    test process leaves it ignored (a late warning must not kill a process that ran
    hpckit), and children inherit what is ignored."""
    before = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGUSR2, before)


def test_a_rank_whose_launcher_ignores_the_signal_keeps_it_too():
    ignored = "import signal, os; signal.signal(signal.SIGUSR2, signal.SIG_IGN); os.execv(*ARGS)"
    command = [MPIEXEC, "-n", "1", sys.executable, "-c", SIGNAL_THEN_IMPORT]
    out = run([sys.executable, "-c", ignored.replace("ARGS", repr((command[0], command)))],
              timeout=60)
    assert "RECEIVED SIGUSR2" in out.output, out.output


def test_a_launched_rank_keeps_a_stop_signal_from_before_import_hpckit():
    out = run([MPIEXEC, "-n", "1", sys.executable, "-c", SIGNAL_THEN_IMPORT], timeout=60)
    assert "RECEIVED SIGUSR2" in out.output, out.output


def test_the_hook_acts_only_in_launched_ranks_and_can_be_turned_off():
    alone = subprocess.run([sys.executable, "-c", SIGNAL_THEN_IMPORT], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert alone.returncode == -signal.SIGUSR2, "outside a launch, Python's default stays"
    for value in ("0", "OFF"):  # as hpckit doctor reads it: any case
        off = run([MPIEXEC, "-n", "1", sys.executable, "-c", SIGNAL_THEN_IMPORT], timeout=60,
                  env={"HPCKIT_EARLY_STOP": value}, expect=None)
        assert off.returncode != 0 and "RECEIVED" not in off.output, value


def test_sigterm_and_other_stop_signals_are_left_to_their_defaults():
    term = SIGNAL_THEN_IMPORT.replace("SIGUSR2)", "SIGTERM)")
    out = run([MPIEXEC, "-n", "1", sys.executable, "-c", term], timeout=60, expect=None,
              env={"HPCKIT_STOP_SIGNAL": "TERM"})
    assert out.returncode != 0 and "RECEIVED" not in out.output


def ranks_started(script: Path, name: str, count: int, timeout: float = 120) -> None:
    """Until ``count`` Python processes run ``script`` for the experiment ``name``."""
    deadline = time.monotonic() + timeout
    while True:
        found = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            found += str(script).encode() in argv and name.encode() in argv
        if found >= count:
            return
        assert time.monotonic() < deadline, f"{count} ranks of {script} never started"
        time.sleep(0.02)


def test_a_plain_sbatch_job_warned_as_its_ranks_start_completes_exactly(
        tmp_path, slurm, steady_torch_reference):
    command = f"{sys.executable} {STEADY} --storage {tmp_path} --name starting --torch"
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, f"--mpi=pmi2 {command}"),
                 "--time=10")
    ranks_started(STEADY, "starting", 2)
    time.sleep(0.3)  # steady.py imports torch before hpckit: it is still importing
    slurm.run("scancel", "--signal=USR2", job)
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    statuses = [a["status"] for a in manifest(tmp_path / "starting")["attempts"]]
    assert statuses == ["requeued", "finished"], output_of(tmp_path)
    assert final_params(output_of(tmp_path)) == steady_torch_reference


def test_mpichs_network_module_is_left_alone_but_under_slurms_pmi_server_on_several_nodes():
    """#56: the hook chooses OFI only in a rank of several nodes whose PMI_FD leads to
    slurmstepd (tests/test_slurm_nodes.py starts MPI so), and never over the user's choice."""
    from hpckit.run.startup.hook import NETMOD, choose_mpich_network

    here, there = socket.socketpair()  # its other end is this process: not slurmstepd
    with here, there:
        rank = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "PMI_FD": str(there.fileno())}
        for environ in ({**rank}, {**rank, "SLURM_STEP_NUM_NODES": "1"},
                        {**rank, "PMI_FD": "not a number"}, {**rank, "PMI_FD": "987"},
                        {**rank, NETMOD: "ucx"}):
            before = dict(environ)
            assert not choose_mpich_network(environ) and environ == before, environ
