"""The MPI side: the library mpi4py loaded, the launcher hpckit would use, how this process
was launched, and where the ranks run."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from typing import Any

from hpckit.doctor.finding import FAIL, OK, WARN, Finding
from hpckit.launch.process import find_mpiexec, launcher_version
from hpckit.run.mpi.library import implementation, srun_plugin
from hpckit.settings import Settings, variable


def library(version: str) -> Finding:
    import mpi4py

    found = f"{version} (mpi4py {mpi4py.__version__})"
    if implementation(version) is None:
        return Finding("MPI library", WARN, found, "hpckit is tested with MPICH, Open MPI and "
                       "Intel MPI; others may work (docs/site.md)")
    return Finding("MPI library", OK, found)


def launcher(settings: Settings, version: str) -> Finding:
    """The mpiexec that ``python train.py`` would start ranks with, against the library."""
    found = find_mpiexec(settings)
    if not found:
        return Finding("launcher", WARN, "no mpiexec next to python or on PATH",
                       "python train.py with num_workers > 1 cannot start ranks (srun and your "
                       f"own mpirun still can); pip install mpich, or set {variable('mpiexec')}")
    try:
        text = launcher_version(found)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("launcher", FAIL, f"{found} --version failed: {exc}",
                       f"set {variable('mpiexec')} to a working mpiexec")
    launch, loaded = implementation(text), implementation(version)
    shown = f"{found}: {launch or 'unknown'}"
    if launch and loaded and launch != loaded:
        return Finding("launcher", FAIL, f"{shown}, but mpi4py loaded {loaded}",
                       f"ranks it starts would not form one job: put {loaded}'s bin first on "
                       f"PATH or set {variable('mpiexec')} to its mpiexec (or rebuild mpi4py "
                       "against the site's MPI: pip install --no-binary mpi4py mpi4py)")
    return Finding("launcher", OK, shown)


def launched(settings: Settings, world_size: int, version: str) -> Finding:
    """How this process was started, and whether MPI saw the tasks its launcher started."""
    tasks, how = settings.launched_tasks, settings.launcher or "alone (a singleton)"
    if tasks is not None and tasks != world_size:
        loaded = implementation(version)
        fix = (f"srun --mpi={srun_plugin(version)} for {loaded or 'this MPI'} "
               "(srun --mpi=list shows what this Slurm offers)" if how == "srun" else
               "launch with the mpiexec of the MPI that mpi4py loaded (see 'launcher')")
        return Finding("launch", FAIL, f"{how} started {tasks} tasks, but MPI sees a world of "
                       f"{world_size}: each task runs alone", fix)
    pmi = _pmi(os.environ)
    slurm_mpi = os.environ.get("SLURM_MPI_TYPE")
    detail = ", ".join(filter(None, [pmi and f"PMI: {pmi}", slurm_mpi and f"srun --mpi={slurm_mpi}"]))
    return Finding("launch", OK, f"{how}, {world_size} rank(s)" + (f", {detail}" if detail else ""))


def _pmi(env: Any) -> str:
    if "PMIX_RANK" in env:
        return "PMIx"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "Open MPI's launcher"
    if "PMI_RANK" in env or "PMI_FD" in env:
        return "PMI-1/2"
    return ""


def placement(hosts: list[str]) -> Finding:
    """Ranks per node, from every rank's host name in rank order."""
    per_node = Counter(hosts)
    counts = sorted(set(per_node.values()))
    found = (f"{len(hosts)} rank(s) on {len(per_node)} node(s), "
             f"{'/'.join(map(str, counts))} per node")
    if len(counts) > 1:
        return Finding("ranks per node", WARN, found, "nodes run different numbers of ranks: "
                       "check --ntasks-per-node (or mpiexec -ppn)")
    return Finding("ranks per node", OK, found)
