"""Shared memory that a requeued Slurm job's killed incarnation left behind.

MPICH names its node-local segment ``mpich_shm_{FNV-1a(PMI jobid):x}_{node}`` (and
``mpich_vci_...``); under ``srun --mpi=pmi2`` the PMI jobid is ``JOBID.STEPID``. A requeued
job keeps its job id and counts its steps from 0 again, so its first ``srun`` finds the
segments of the killed incarnation under the very same names, attaches to them as if a
peer had made them, and fails in ``MPI_Init`` ("Message truncated") or hangs.

Before MPI starts, the first rank of each incarnation on a node (incarnations are told
apart by their slurmstepd: pid and start time) removes the segments of *this* job step,
owned by this user, that no live process maps: those provably belong to dead processes.
A file lock makes every other rank of the incarnation wait until that is done, so no
rank ever removes a segment that a peer of its own incarnation has just made.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import socket
import time
from collections.abc import Iterator

from hpckit.logs import log
from hpckit.processes import alive, ancestor
from hpckit.settings import Settings

SHM_DIR = "/dev/shm"
EXIT_WAIT_S = 5.0
RECHECK_S = 0.2


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
    """Remove this job step's segments left by a dead incarnation; returns their names."""
    if settings.launcher != "srun" or not (settings.slurm_job_id and settings.slurm_step_id):
        return []
    stepd = ancestor("slurmstepd")
    if stepd is None or not os.path.isdir(shm_dir):
        return []
    job_step = f"{settings.slurm_job_id}.{settings.slurm_step_id}"
    prefix = os.path.join(shm_dir, f"hpckit-{os.getuid()}-{job_step}")
    marker = f"{prefix}-incarnation-{stepd.pid}-{stepd.started}"
    with _locked(f"{prefix}.lock"):
        if os.path.exists(marker):
            return []
        removed = remove_unmapped(segment_patterns(job_step, shm_dir))
        for earlier in glob.glob(f"{prefix}-incarnation-*"):
            with contextlib.suppress(OSError):
                os.unlink(earlier)
        open(marker, "w").close()
    if removed:
        log.warning("removed MPICH shared memory that a killed run of Slurm job step %s left on "
                    "this node (it would break MPI start-up): %s", job_step, ", ".join(removed))
    return removed


def remove_unmapped(patterns: list[str], since: float = 0.0) -> list[str]:
    """Remove this user's segments matching ``patterns``, changed since ``since``, that no
    live process maps; returns their names. A segment must be unmapped in two looks
    RECHECK_S apart: one that another job's rank has just created is mapped by then."""
    candidates = [path for path, changed in _owned(patterns) if changed >= since]
    unmapped = [path for path in candidates if path not in _mapped_paths()] if candidates else []
    if unmapped:
        time.sleep(RECHECK_S)
        mapped = _mapped_paths()
        unmapped = [path for path in unmapped if path not in mapped]
    removed = []
    for path in unmapped:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(os.path.basename(path))
    return sorted(removed)


def remove_left_by_ranks(since: float, ranks: list[int]) -> None:
    """After the launcher of ``ranks`` (PIDs) on this node returned: the segments that those
    of them that died left since ``since`` (MPICH's ``mpich_*``, Open MPI's ``sm_segment.``
    of this host and user; each MPI removes its own in MPI_Finalize). Each holds megabytes
    of RAM until the node reboots. Ranks the launcher killed may take a moment to be gone,
    and they map the segment until then."""
    deadline = time.monotonic() + EXIT_WAIT_S
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    open_mpi = f"sm_segment.{socket.gethostname()}.{os.getuid()}.*"
    try:
        removed = remove_unmapped([os.path.join(SHM_DIR, "mpich_*"),
                                   os.path.join(SHM_DIR, open_mpi)], since=since)
    except OSError as exc:  # tidying up must not hide how the ranks ended
        log.debug("could not look for MPI shared memory in %s: %s", SHM_DIR, exc)
        return
    if removed:
        log.info("removed the MPI shared memory that ended ranks left in %s: %s", SHM_DIR,
                 ", ".join(removed))


def _owned(patterns: list[str]) -> list[tuple[str, float]]:
    """This user's files matching ``patterns``, with when each last changed."""
    found = []
    for path in (p for pattern in patterns for p in glob.glob(pattern)):
        with contextlib.suppress(FileNotFoundError):
            status = os.stat(path)
            if status.st_uid == os.getuid():
                found.append((path, status.st_mtime))
    return found


def _mapped_paths() -> set[str]:
    """Files under /dev/shm that some process of this user maps."""
    mapped = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    if SHM_DIR in line:
                        mapped.add(line.split(None, 5)[-1].strip().removesuffix(" (deleted)"))
        except OSError:
            continue
    return mapped


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
