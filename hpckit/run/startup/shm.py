"""Shared memory that an earlier run of a Slurm job step left behind.

MPICH names its node-local segment ``mpich_shm_{FNV-1a(PMI jobid):x}_{node}`` (and
``mpich_vci_...``); under ``srun --mpi=pmi2`` the PMI jobid is ``JOBID.STEPID``. The first
rank to open the name creates the segment, every other rank attaches to what it finds. A
requeued job keeps its job id and counts its steps from 0 again, so its first ``srun`` finds
the segments of the killed incarnation under the very same names, attaches to them as if a
peer had made them, and fails in ``MPI_Init`` ("Message truncated"), hangs, or sends its PMI
server whatever the old memory held. A job id that Slurm hands out a second time (its state
was reset, ``FirstJobId`` was lowered, two controllers share the node) does the same.

Before MPI starts, each rank looks at this job step's segments, owned by this user, that
were made before this incarnation's slurmstepd started (so by none of its ranks): one that
no live process maps is removed; one that a live process maps belongs to a run that is
still going, and the rank refuses to start rather than attach to that run's memory. The
ranks of a node take turns (a lock that is an abstract socket, so that nothing is left in
/dev/shm), so no rank looks at a name while a peer replaces it.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import socket
import time
from collections.abc import Iterator

from hpckit.errors import LaunchError
from hpckit.logs import log
from hpckit.processes import alive, ancestor, started_at, stat
from hpckit.settings import Settings

SHM_DIR = "/dev/shm"
ENDED_WAIT_S = 5.0
RECHECK_S = 0.2
# A segment made this long before the slurmstepd started is an earlier run's. Its ranks were
# killed and the job started again, which takes Slurm seconds; this run's ranks make theirs
# after Python has started, well after their slurmstepd. /proc's start times are 10 ms apart.
EARLIER_BY_S = 0.5
TURN_WAIT_S = 60.0


def fnv1a(text: str) -> int:
    """32-bit FNV-1a, the hash MPICH applies to the PMI jobid (uthash's HASH_FNV)."""
    value = 2166136261
    for byte in text.encode():
        value = ((value ^ byte) * 16777619) & 0xFFFFFFFF
    return value


def segment_patterns(job_step: str, shm_dir: str = SHM_DIR) -> list[str]:
    world = f"{fnv1a(job_step):x}"
    return [os.path.join(shm_dir, f"mpich_{kind}_{world}_*") for kind in ("shm", "vci")]


def clear_stale_segments(settings: Settings, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove this job step's segments that an earlier run left; returns their names.

    Raises :class:`LaunchError` where a live process outside this run maps one of them."""
    if settings.launcher != "srun" or not (settings.slurm_job_id and settings.slurm_step_id):
        return []
    stepd = ancestor("slurmstepd")
    began = started_at(stepd.pid) if stepd is not None else None
    if began is None or not os.path.isdir(shm_dir):
        return []
    job_step = f"{settings.slurm_job_id}.{settings.slurm_step_id}"
    with _turn(f"hpckit-shm-{os.getuid()}-{job_step}") as taken:
        if not taken:
            log.warning("could not check for stale MPICH shared memory of Slurm job step %s: "
                        "another rank on this node held the check for %.0f s", job_step,
                        TURN_WAIT_S)
            return []
        earlier = [path for path, status in _owned(segment_patterns(job_step, shm_dir))
                   if status.st_ctime < began - EARLIER_BY_S]
        if not earlier:
            return []
        _refuse_in_use(earlier, job_step)
        removed = remove_unmapped(earlier)
    if removed:
        log.warning("removed MPICH shared memory that a killed run of Slurm job step %s left on "
                    "this node (it would break MPI start-up): %s", job_step, ", ".join(removed))
    return removed


def _refuse_in_use(earlier: list[str], job_step: str) -> None:
    """An earlier run's segment that a live process maps: that run is still going."""
    users = mapping_pids()
    in_use = {path: users[key] for path in earlier if (key := _identity(path)) in users}
    if not in_use:
        return
    path, pids = next(iter(sorted(in_use.items())))
    who = ", ".join(_describe(pid) for pid in sorted(pids)[:3])
    raise LaunchError(
        f"Slurm job step {job_step} on {socket.gethostname()}: MPICH's shared memory {path} "
        f"was made before this job step started and is still in use by {who}. That is another "
        f"run with the same job id (Slurm hands out a job id again after its state was reset "
        f"or FirstJobId was lowered) or a process of an earlier run of this job that outlived "
        f"it; MPI start-up would attach to its memory. End that process, or give Slurm a "
        f"FirstJobId above every job id it used before, and submit again")


def _describe(pid: int) -> str:
    found = stat(pid)
    return f"pid {pid} ({found.name})" if found is not None else f"pid {pid}"


@contextlib.contextmanager
def _turn(name: str, wait: float = TURN_WAIT_S) -> Iterator[bool]:
    """One process of this node at a time (yields whether it got its turn in ``wait``
    seconds): a bound abstract UNIX socket, which the kernel frees when it is closed or its
    process dies, and which leaves no file behind."""
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        yield _bind(holder, "\0" + name, time.monotonic() + wait)
    finally:
        holder.close()


def _bind(holder: socket.socket, address: str, deadline: float) -> bool:
    while True:
        try:
            holder.bind(address)
            return True
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def remove_unmapped(paths_or_patterns: list[str], since: float = 0.0) -> list[str]:
    """Remove this user's files among ``paths_or_patterns`` (glob patterns), changed since
    ``since``, that no live process maps; returns their names. A file must be unmapped in
    two looks RECHECK_S apart: one that another job's rank has just created is mapped by
    then."""
    candidates = [path for path, status in _owned(paths_or_patterns) if status.st_mtime >= since]
    left = unmapped(candidates)
    if left:
        time.sleep(RECHECK_S)
        left = unmapped(left)
    removed = []
    for path in left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(os.path.basename(path))
    return sorted(removed)


def remove_left_by_ranks(ranks: list[int], segments: list[str]) -> None:
    """After the launcher of ``ranks`` (PIDs) on this node returned: those of ``segments``
    (the names in /dev/shm that these ranks' MPI made, as each recorded them) that ranks
    which died left behind; each MPI removes its own in MPI_Finalize, and a segment holds
    megabytes of RAM until the node reboots. Never another job's: a name none of these ranks
    mapped is not looked at. Ranks the launcher killed may take a moment to be gone, and
    they map the segment until then."""
    deadline = time.monotonic() + ENDED_WAIT_S
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    patterns = sorted({pattern for name in segments for pattern in job_patterns(name)})
    try:
        removed = remove_unmapped([os.path.join(SHM_DIR, pattern) for pattern in patterns])
    except OSError as exc:  # tidying up must not hide how the ranks ended
        log.debug("could not look for MPI shared memory in %s: %s", SHM_DIR, exc)
        return
    if removed:
        log.info("removed the MPI shared memory that ended ranks left in %s: %s", SHM_DIR,
                 ", ".join(removed))


def mapped_segments() -> list[str]:
    """The names in /dev/shm that this process maps and its MPI made (MPICH's ``mpich_*``,
    Open MPI's ``sm_segment.*``): what this rank leaves there if it dies."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                if path.startswith(SHM_DIR + "/") and not path.endswith(" (deleted)"):
                    if _is_mpis(name := os.path.basename(path)):
                        found.add(name)
    except OSError:
        return []
    return sorted(found)


def _is_mpis(name: str) -> bool:
    return bool(job_patterns(name))


def job_patterns(name: str) -> list[str]:
    """Globs for every segment of the MPI job that made segment ``name``: MPICH's
    ``mpich_{shm,vci}_{hash of the job's PMI name}_{n}``, Open MPI's
    ``sm_segment.{host}.{uid}.{job id}.{n}``; none for a name of neither."""
    mpich = re.fullmatch(r"mpich_(?:shm|vci)_([0-9a-f]+)_\d+", name)
    if mpich:
        return [f"mpich_{kind}_{mpich.group(1)}_*" for kind in ("shm", "vci")]
    open_mpi = re.fullmatch(r"(sm_segment\.[\w.-]+)\.[0-9a-f]+", name)
    return [f"{glob.escape(open_mpi.group(1))}.*"] if open_mpi else []


def _owned(patterns: list[str]) -> list[tuple[str, os.stat_result]]:
    """This user's files matching ``patterns``, with their status."""
    found = []
    for path in (p for pattern in patterns for p in glob.glob(pattern)):
        with contextlib.suppress(FileNotFoundError):
            status = os.stat(path)
            if status.st_uid == os.getuid():
                found.append((path, status))
    return found


def unmapped(paths: list[str]) -> list[str]:
    """Those of ``paths`` that no live process maps now (one look)."""
    mapped = mapping_pids() if paths else {}
    return [path for path in paths if _identity(path) not in mapped]


def mapping_pids() -> dict[tuple[int, int], set[int]]:
    """The files under /dev/shm that processes map, by (device, inode), with those processes.

    By inode, not by name: glibc's ``sem_open`` maps a temporary file and then links it to
    the semaphore's name (Python's ``sem.mp-*``), so its creator's mapping names a deleted
    file while the name in /dev/shm is in use all the same."""
    mapped: dict[tuple[int, int], set[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    if SHM_DIR in line:
                        mapped.setdefault(_mapped_identity(line), set()).add(int(entry))
        except OSError:
            continue
    return mapped


def _mapped_identity(line: str) -> tuple[int, int]:
    """(device, inode) of a line of /proc/PID/maps: ``addr perms offset MAJ:MIN inode path``."""
    _, _, _, device, inode = line.split(None, 5)[:5]
    major, minor = (int(part, 16) for part in device.split(":"))
    return os.makedev(major, minor), int(inode)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino
