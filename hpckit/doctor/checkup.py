"""Every check, on every rank: what each rank sees is gathered, and rank 0 gets the findings."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from hpckit.doctor import framework, mpi, nodes, slurm, startup, storage
from hpckit.doctor.finding import FAIL, Finding, worst
from hpckit.run.job import DEFAULT_STORAGE
from hpckit.run.mpi.library import loaded_version
from hpckit.run.mpi.waiting import from_root, gather_to_root
from hpckit.settings import Settings
from hpckit.storage.location import resolve

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


def checkup(comm: Comm, settings: Settings, storage_path: str | None,
            cache_dir: str | None) -> tuple[list[Finding] | None, int]:
    """The findings (on rank 0; None elsewhere) and the exit status every rank returns:
    1 when a check failed, else 0."""
    version = loaded_version()
    mine: dict[str, Any] = {"host": socket.gethostname(), "torch": framework.look()}
    everyone = gather_to_root(comm, mine)
    location = resolve(os.path.expanduser(storage_path or settings.storage or DEFAULT_STORAGE))
    shared = storage.shared_storage(comm, location)
    cached = storage.cache_dir(comm, cache_dir)
    findings = None
    if comm.rank == 0 and everyone is not None:
        findings = [
            mpi.library(version), mpi.launcher(settings, version),
            mpi.launched(settings, comm.size, version), mpi.placement([r["host"] for r in everyone]),
            *framework.torch_build([r["torch"] for r in everyone]),
            framework.gpus([r["torch"] for r in everyone]), framework.nccl(),
            *[f for f in (shared, cached) if f is not None],
            startup.early_stop(), *slurm.job_settings(settings),
            nodes.lost_node_watch(settings)]
    status = from_root(comm, 1 if findings and worst(findings) == FAIL else 0)
    return findings, int(status)
