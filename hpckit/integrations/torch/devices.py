"""Which device each rank trains on: pure functions, tested without GPUs."""

from __future__ import annotations

import math

from hpckit.errors import LaunchError


def assign_gpus(local_rank: int, local_size: int, gpus_per_worker: float, device_count: int,
                visible: list[str | None], hostname: str) -> list[int]:
    """Device indexes for this rank.

    When the launcher already gave each rank its own GPUs (``srun --gpus-per-task``: every
    local rank sees different ``CUDA_VISIBLE_DEVICES``), each rank uses its first devices;
    otherwise the node's devices are split among its local ranks in order. A fraction
    (e.g. 0.5) lets several ranks share one device.
    """
    per_rank_visibility = len(visible) > 1 and len(set(visible)) == len(visible) and None not in visible
    if per_rank_visibility:
        wanted, first = max(1, math.ceil(gpus_per_worker)), 0
        node_needs = wanted
    else:
        node_needs = math.ceil(local_size * gpus_per_worker)
        wanted = max(1, math.ceil(gpus_per_worker))
        first = math.floor(local_rank * gpus_per_worker + 1e-9)
    if device_count < node_needs or first + wanted > device_count:
        raise LaunchError(
            f"node {hostname} has {device_count} visible GPU(s) but its {local_size} rank(s) need "
            f"{node_needs} ({gpus_per_worker:g} per rank; CUDA_VISIBLE_DEVICES="
            f"{visible[local_rank]!r}). Start fewer ranks per node (e.g. srun --ntasks-per-node="
            f"{max(1, int(device_count // max(gpus_per_worker, 1e-9)))}), request more GPUs "
            "(--gpus-per-node), or lower resources_per_worker['GPU'].")
    return list(range(first, first + wanted))


def cpu_threads(requested: int | None, available: int, local_size: int) -> int:
    """Threads per rank: as requested, else the node's CPUs shared evenly among its ranks."""
    if requested is not None:
        return requested
    return max(1, available // max(1, local_size))
