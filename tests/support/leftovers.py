"""What a test module leaves on the machine, looked at after each module (conftest's
``nothing_left_behind``): a test must not depend on what ran before it in its worker, nor on
what runs beside it on the other worker.

- **Variables**: the worker's ``os.environ`` is as it was. One exception, reset rather than
  reported: a ``fit()`` run inside the test process keeps its torch.distributed group, and
  the variables torch's launchers set for it (``RANK``, ``MASTER_PORT``...), for a second
  ``fit()`` in the same process, as hpckit intends, and its deterministic seeding sets
  ``CUBLAS_WORKSPACE_CONFIG`` for the process; the group is destroyed and those variables
  restored, so that the next module starts without them.
- **Processes**: every process the tests start inherits ``MARK`` (this worker and session),
  the Slurm jobs too (sbatch exports the submitter's environment). Those still alive after
  the module are leftovers, except the session's daemons (Slurm, the S3 server), which carry
  ``DAEMON`` as well. A leftover is killed by its PID once it has been named.
- **Mounts**: new mount points, except under the other workers' (and other runs') temporary
  directories and under a session cluster's root.
- **/dev/shm**: new entries that no process maps. MPI's segments (MPICH's ``mpich_*``, UCX's
  ``ucx_shm_posix_*``, Open MPI's ``sm_segment.*``), Python's named semaphores
  (``sem.mp-*``) and glibc's file for one being made (``sem.`` and six characters, linked to
  its name and removed by ``sem_open`` itself, left where a rank is killed in between: a
  DataLoader starting its workers) are what a SIGKILLed rank cannot remove (MPICH removes
  its segments in MPI_Finalize): the tests that kill ranks do it on purpose, so those are removed here, and
  at the end of the session. Anything else is a leftover.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpckit.processes import alive, stat
from hpckit.run.startup.shm import RECHECK_S, SHM_DIR, remove_unmapped, unmapped

MARK = "HPCKIT_TEST_SESSION"
DAEMON = "HPCKIT_TEST_DAEMON"
EXIT_WAIT_S = 10.0
# pytest's own, and what libraries set on their first import in this process (Lightning,
# torch's compiler): not a test's doing, and there for the process's life whoever imports.
NOT_A_TESTS = ("PYTEST_CURRENT_TEST", "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR")
TORCH_GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                         "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
# Set for the process by hpckit.torch's deterministic seeding (cuBLAS reads it once).
PROCESS_VARIABLES = ("CUBLAS_WORKSPACE_CONFIG",)
KILLED_RANKS_LEAVE = ("mpich_*", "ucx_shm_posix_*", "sm_segment.*", "sem.mp-*", "sem.??????")
# MPICH's launcher writes the node's topology here, whatever TMPDIR says, and removes it as it
# exits; one that a test SIGKILLs (a whole job, on purpose) leaves it.
KILLED_LAUNCHERS_LEAVE = "/tmp/hydra_hwloc_xmlfile_*"


@dataclass(frozen=True)
class Machine:
    at: float
    environment: dict[str, str]
    processes: dict[int, str]  # this session's live processes: pid -> command line
    mounts: frozenset[str]
    shm: frozenset[str]


def mark() -> str:
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"


def look() -> Machine:
    return Machine(time.time(), dict(os.environ), _marked_processes(), _mount_points(),
                   frozenset(os.listdir(SHM_DIR)) if os.path.isdir(SHM_DIR) else frozenset())


def left_behind(before: Machine, temp_root: Path, session_roots: list[Path]) -> list[str]:
    """What the module left, described, once exiting processes had time to end; the
    processes among it are killed and the segments of killed ranks removed."""
    _reset_torch_group(before.environment)
    found = [*_variables(before.environment, dict(os.environ))]
    found += _processes(set(before.processes))
    found += [f"mount {point}" for point in sorted(_mount_points() - before.mounts)
              if not _excused(Path(point), temp_root, session_roots)]
    found += [f"/dev/shm/{name}" for name in _shm_left(before)]
    return found


def _reset_torch_group(environment: dict[str, str]) -> None:
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()
    for name in TORCH_GROUP_VARIABLES + PROCESS_VARIABLES:
        if name in environment:
            os.environ[name] = environment[name]
        else:
            os.environ.pop(name, None)


def _variables(before: dict[str, str], after: dict[str, str]) -> list[str]:
    changed = sorted(k for k in before.keys() | after.keys()
                     if before.get(k) != after.get(k) and k not in NOT_A_TESTS)
    return [f"variable {k}: {before.get(k)!r} -> {after.get(k)!r}" for k in changed]


def remove_killed_ranks_leftovers() -> list[str]:
    """At the end of the session: every segment and semaphore that no process maps."""
    return remove_unmapped([os.path.join(SHM_DIR, p) for p in KILLED_RANKS_LEAVE])


def remove_killed_launchers_files(since: float) -> list[str]:
    """At the end of the session: the launchers' topology files made since ``since`` that
    no live process holds open (a running launcher's proxies do), in two looks RECHECK_S
    apart, as for the segments."""
    left = [path for path in glob.glob(KILLED_LAUNCHERS_LEAVE) if _changed_since(path, since)]
    for look in range(2):
        if look and left:
            time.sleep(RECHECK_S)
        held = _open_files()
        left = [path for path in left if path not in held]
    removed = []
    for path in left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(os.path.basename(path))
    return removed


def _changed_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except FileNotFoundError:
        return False


def _open_files() -> set[str]:
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return held


def daemons_left() -> list[str]:
    """At the end of the session: any process of it still alive, its daemons included."""
    return _processes(set(), daemons=True)


def _processes(before: set[int], daemons: bool = False) -> list[str]:
    deadline = time.monotonic() + EXIT_WAIT_S
    left = {pid: command for pid, command in _marked_processes(daemons).items()
            if pid not in before}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {pid: command for pid, command in left.items() if alive(pid)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"process {pid}: {command}" for pid, command in sorted(left.items())]


def _marked_processes(daemons: bool = False) -> dict[int, str]:
    """This session's live processes but this one, its daemons only if ``daemons``."""
    wanted = f"{MARK}={mark()}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environment = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if wanted in environment and (daemons or f"{DAEMON}=1".encode() not in environment):
            found[int(entry)] = command or f"[{_name(int(entry))}]"
    return {pid: command for pid, command in found.items() if alive(pid)}


def _name(pid: int) -> str:
    status = stat(pid)
    return status.name if status is not None else "?"


def _mount_points() -> frozenset[str]:
    with open("/proc/self/mountinfo") as f:
        return frozenset(line.split()[4] for line in f)


def _excused(point: Path, temp_root: Path, session_roots: list[Path]) -> bool:
    """Under another worker's temporary directory or another run's (pytest-of-USER holds
    every run's), or under a session cluster's."""
    runs_root = temp_root.parent.parent
    others = point.is_relative_to(runs_root) and not point.is_relative_to(temp_root)
    return others or any(point.is_relative_to(root) for root in session_roots)


def _shm_left(before: Machine) -> list[str]:
    """New entries of /dev/shm that no process maps in two looks; the killed ranks' kinds are
    removed instead (those of the other worker's live ranks are mapped, and stay)."""
    if not os.path.isdir(SHM_DIR):
        return []
    remove_unmapped([os.path.join(SHM_DIR, pattern) for pattern in KILLED_RANKS_LEAVE],
                    since=before.at)
    new = {os.path.join(SHM_DIR, name) for name in set(os.listdir(SHM_DIR)) - before.shm
           if not any(fnmatch.fnmatch(name, pattern) for pattern in KILLED_RANKS_LEAVE)}
    left = unmapped(sorted(new))
    if left:
        time.sleep(RECHECK_S)
        left = unmapped(left)
    return sorted(os.path.basename(path) for path in left if os.path.exists(path))
