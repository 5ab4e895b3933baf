"""MPICH's node-local shared memory of a Slurm job step: what an earlier run with the same
job step left is removed before MPI starts; what a run still going maps is never attached to.

The first two tests run a rank under a process named slurmstepd (a Python process that
renamed itself), with the variables srun sets: the rules without a cluster. The last one
hands a job id of the real one-node Slurm to a second run while the first still maps its
memory, as a Slurm whose state was reset does."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import JOB
from support.slurm_jobs import minimal_script, output_of, sbatch, wait

from hpckit.run.startup.shm import EARLIER_BY_S, SHM_DIR, fnv1a

RANK = """\
import sys
from hpckit.run.startup.shm import clear_stale_segments
from hpckit.settings import current
try:
    print("REMOVED", clear_stale_segments(current()))
except Exception as exc:
    print(f"REFUSED {type(exc).__name__}: {exc}")
"""

STEPD = """\
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(15, b"slurmstepd")  # PR_SET_NAME: what /proc/PID/stat calls it
sys.exit(subprocess.run([sys.executable, "-c", sys.argv[1]]).returncode)
"""

MAPS = """\
import mmap, sys
with open(sys.argv[1], "r+b") as f, mmap.mmap(f.fileno(), 0):
    print("mapped", flush=True)
    sys.stdin.read()
"""


def _job_step_env(job: str) -> dict[str, str]:
    return {**os.environ, "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}


def _segment(job: str, node: int = 0) -> Path:
    return Path(SHM_DIR, f"mpich_shm_{fnv1a(f'{job}.0'):x}_{node}")


def _rank_under_stepd(job: str) -> str:
    out = subprocess.run([sys.executable, "-c", STEPD, RANK], env=_job_step_env(job),
                         capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


@pytest.fixture
def job_id() -> str:
    """A job id no Slurm of the tests hands out (theirs are below 67,000,001)."""
    return str(90_000_000 + os.getpid() % 1_000_000)


@pytest.mark.alone  # its segment lies unmapped for a second: the other worker's check after
# a module (tests/support/leftovers.py) would take it for a killed rank's and remove it first
def test_an_earlier_runs_unmapped_segment_is_removed_and_this_runs_is_kept(job_id):
    earlier, this_run = _segment(job_id, 0), _segment(job_id, 1)
    try:
        earlier.write_bytes(b"\0" * mmap.PAGESIZE)
        time.sleep(EARLIER_BY_S + 0.2)
        # The rank's slurmstepd starts now: made before it, `earlier` is another run's.
        stepd = subprocess.Popen([sys.executable, "-c", STEPD, f"""\
import pathlib, time
pathlib.Path({str(this_run)!r}).write_bytes(bytes({mmap.PAGESIZE}))
exec(compile({RANK!r}, "rank", "exec"))
"""], env=_job_step_env(job_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output, _ = stepd.communicate(timeout=60)
        # Removed at `import hpckit` already, before the rank's own look finds nothing left.
        assert not earlier.exists() and this_run.exists(), output
        assert earlier.name in output and this_run.name not in output, output
    finally:
        earlier.unlink(missing_ok=True)
        this_run.unlink(missing_ok=True)


def test_an_earlier_runs_segment_that_a_live_process_maps_is_refused_naming_it(job_id):
    segment = _segment(job_id)
    segment.write_bytes(b"\0" * mmap.PAGESIZE)
    holder = subprocess.Popen([sys.executable, "-c", MAPS, str(segment)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"  # type: ignore[union-attr]
        time.sleep(EARLIER_BY_S + 0.2)
        output = _rank_under_stepd(job_id)
        assert (f"REFUSED LaunchError: Slurm job step {job_id}.0 on" in output
                and f"MPICH's shared memory {segment} was made before this job step started and "
                    f"is still in use by pid {holder.pid} (python" in output), output
        assert segment.exists(), "another run's memory was removed"
    finally:
        holder.communicate(timeout=30)
        segment.unlink(missing_ok=True)


def test_a_job_id_handed_out_again_while_its_first_run_maps_its_memory_is_refused(
        tmp_path, slurm):
    """As after slurmctld's state was reset: job J's ranks find a live run's segment under
    J.0's name. Each ends with one line naming it instead of attaching to it."""
    command = f"--mpi=pmi2 {sys.executable} {JOB} --storage {tmp_path} --name reused"
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--hold")
    segment = _segment(job)
    segment.write_bytes(b"\0" * 4 * mmap.PAGESIZE)
    holder = subprocess.Popen([sys.executable, "-c", MAPS, str(segment)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"  # type: ignore[union-attr]
        time.sleep(EARLIER_BY_S + 0.2)
        slurm.run("scontrol", "release", job)
        states = wait(slurm, tmp_path, job, 120)
        output = output_of(tmp_path)
        assert states == {job: "FAILED"}, output
        assert (f"LaunchError: Slurm job step {job}.0 on " in output
                and f"is still in use by pid {holder.pid} (python" in output), output
        assert "mpi/pmi2" not in output and "Fatal error" not in output, output
        assert segment.exists()
    finally:
        holder.communicate(timeout=30)
        segment.unlink(missing_ok=True)


@pytest.mark.quick
def test_only_shared_memory_that_nothing_maps_is_removed():
    """The segments' times lie hours back: the other worker's leftover check removes the
    unmapped ``mpich_*`` made since its module began."""
    from hpckit.run.startup.shm import SHM_DIR, remove_unmapped

    prefix = f"mpich_shm_test{os.getpid()}"
    old, new, mapped = (Path(SHM_DIR, f"{prefix}{name}_0") for name in ("old", "new", "mapped"))
    pattern = [f"{SHM_DIR}/{prefix}*"]
    try:
        for segment, hours_ago in ((old, 4), (new, 2), (mapped, 2)):
            segment.write_bytes(b"\0" * mmap.PAGESIZE)
            os.utime(segment, (time.time() - hours_ago * 3600,) * 2)
        with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 0):
            assert remove_unmapped(pattern, since=time.time() - 3 * 3600) == [new.name]
            assert old.exists() and not new.exists()
            assert remove_unmapped(pattern) == [old.name]
        assert not old.exists() and mapped.exists()
    finally:
        for segment in (old, new, mapped):
            segment.unlink(missing_ok=True)


@pytest.mark.quick
def test_the_topology_files_of_killed_launchers_are_removed_and_one_in_use_is_kept():
    """MPICH's launcher writes /tmp/hydra_hwloc_xmlfile_* whatever TMPDIR says and removes it
    as it exits: the suite's SIGKILLed jobs left about 30 a run. At the session's end those
    made since it began go, but one that a process holds open (a running launcher's proxy
    does) and one older than the session. Their times lie hours back, so that another
    session's end removes none of them."""
    from support.leftovers import KILLED_LAUNCHERS_LEAVE, remove_killed_launchers_files

    made = [Path(KILLED_LAUNCHERS_LEAVE.replace("*", f"test{os.getpid()}{name}"))
            for name in ("old", "left", "held")]
    old, left, held = made
    try:
        for path, hours_ago in ((old, 4), (left, 2), (held, 2)):
            path.write_text("<topology/>")
            os.utime(path, (time.time() - hours_ago * 3600,) * 2)
        with open(held):
            removed = remove_killed_launchers_files(since=time.time() - 3 * 3600)
        assert left.name in removed and not {old.name, held.name} & set(removed), removed
        assert old.exists() and held.exists() and not left.exists()
    finally:
        for path in made:
            path.unlink(missing_ok=True)


@pytest.mark.quick
def test_a_named_semaphore_in_use_is_not_taken_for_a_killed_ranks():
    """glibc maps a semaphore under a temporary name, then links it to ``sem.mp-*``: a
    DataLoader's semaphore looks unmapped by name, and its workers open it by name later."""
    import _multiprocessing

    from hpckit.run.startup.shm import SHM_DIR, remove_unmapped

    name = f"/mp-hpckit-test-{os.getpid()}"  # as multiprocessing names it, without its tracker
    semaphore = _multiprocessing.SemLock(1, 1, 1, name, False)
    try:
        assert remove_unmapped([f"{SHM_DIR}/sem.{name[1:]}"]) == []
        assert Path(SHM_DIR, f"sem.{name[1:]}").exists()
    finally:
        _multiprocessing.sem_unlink(name)
        del semaphore


@pytest.mark.alone  # compares /dev/shm before and after
def test_only_the_segments_of_the_ranks_it_started_are_removed(tmp_path):
    """#65: ``python train.py`` whose rank is SIGKILLed mid-run (restarted, max_failures=1):
    the segments the killed attempt's ranks left are removed once its mpiexec has returned,
    and an unused segment of another MPI job of the same user, made while this run ran, is
    not."""
    from support.scenarios import killed_once_and_restarted

    before = set(os.listdir(SHM_DIR))
    other = Path(SHM_DIR, f"mpich_shm_0badc0de_{os.getpid() % 100}")
    made = subprocess.Popen([sys.executable, "-c", f"""
import time
time.sleep(3)
open({str(other)!r}, "wb").write(bytes(4096))
"""])
    try:
        returncode, output = killed_once_and_restarted(sys.executable, tmp_path, {})
        made.wait(timeout=30)
        assert returncode == 0, output
        assert other.exists(), f"another job's segment was removed:\n{output}"
        left = set(os.listdir(SHM_DIR)) - before - {other.name}
        assert not left, f"left in /dev/shm: {left}\n{output}"
        assert "removed the MPI shared memory that ended ranks left" in output, output
    finally:
        made.kill()
        other.unlink(missing_ok=True)
