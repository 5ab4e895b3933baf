"""Which GPUs and how many CPU threads each rank gets: pure functions, tested on simulated
nodes without GPUs.

As Ray gives each worker its own ``CUDA_VISIBLE_DEVICES``, hpckit narrows every rank's to the
devices it trains on before CUDA starts, so that a rank sees them as ``cuda:0``, ``cuda:1``,
… and frameworks that count devices (Lightning's ``devices="auto"``) count only its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpckit.errors import LaunchError


@dataclass(frozen=True)
class GpuShare:
    """One rank's GPUs: ``entries`` as CUDA_VISIBLE_DEVICES names them (indices, ``GPU-…``
    UUIDs or ``MIG-…`` instances), and where they start among the devices the rank sees now
    (what it uses where CUDA already started and the list can no longer be narrowed)."""

    entries: tuple[str, ...]
    first: int

    @property
    def visible(self) -> str:
        """The rank's own CUDA_VISIBLE_DEVICES."""
        return ",".join(self.entries)


def listed_devices(visible: str | None, count: int) -> list[str]:
    """The devices a process sees, as CUDA_VISIBLE_DEVICES names them: its entries, or the
    indices ``0 .. count-1`` where it is unset."""
    if visible is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in visible.split(",") if entry.strip()]


def bound_by_launcher(visible: list[str | None]) -> bool:
    """Every local rank already sees devices of its own (``srun --gpus-per-task``,
    ``--gpu-bind``): their CUDA_VISIBLE_DEVICES differ."""
    return len(visible) > 1 and None not in visible and len(set(visible)) == len(visible)


def share_gpus(local_rank: int, local_size: int, gpus_per_worker: float, count: int,
               visible: list[str | None], hostname: str) -> GpuShare:
    """This rank's GPUs, given each local rank's CUDA_VISIBLE_DEVICES (``visible``) and the
    number of devices this rank sees (``count``).

    A rank the launcher already bound keeps the first of its own devices; otherwise the
    node's devices are split among its local ranks in order. A fraction (e.g. 0.5) lets
    several ranks share one device.
    """
    devices = listed_devices(visible[local_rank], count)
    wanted = max(1, math.ceil(gpus_per_worker - 1e-9))
    if bound_by_launcher(visible):
        first, node_needs = 0, wanted
    else:
        first = math.floor(local_rank * gpus_per_worker + 1e-9)
        node_needs = math.ceil(local_size * gpus_per_worker - 1e-9)
    if len(devices) < node_needs or first + wanted > len(devices):
        shown = "unset" if visible[local_rank] is None else repr(visible[local_rank])
        raise LaunchError(
            f"node {hostname} has {len(devices)} visible GPU(s) but its {local_size} rank(s) "
            f"need {node_needs} ({gpus_per_worker:g} per rank; CUDA_VISIBLE_DEVICES {shown}). "
            "Start fewer ranks per node (e.g. srun --ntasks-per-node="
            f"{max(1, int(len(devices) // max(gpus_per_worker, 1e-9)))}), request more GPUs "
            "(--gpus-per-node), or lower resources_per_worker['GPU'].")
    return GpuShare(tuple(devices[first:first + wanted]), first)


def cpu_threads(requested: int | None, masks: list[frozenset[int]], local_rank: int,
                slurm_cpus_per_task: int | None) -> int:
    """Threads per rank: as requested; else this rank's CPUs (its affinity mask) shared
    among the local ranks bound to the same mask, and never more than Slurm's
    ``--cpus-per-task`` where it was given (Slurm need not bind a task to its CPUs)."""
    if requested is not None:
        return requested
    own = masks[local_rank]
    threads = len(own) // max(1, sum(1 for mask in masks if mask == own))
    if slurm_cpus_per_task:
        threads = min(threads, slurm_cpus_per_task)
    return max(1, threads)
