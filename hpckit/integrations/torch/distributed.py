"""torch.distributed for the MPI world: device choice and a rendezvous agreed over MPI."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

from hpckit.config import ScalingConfig
from hpckit.errors import LaunchError
from hpckit.integrations.torch.devices import assign_gpus, cpu_threads
from hpckit.logs import log
from hpckit.run.comm import Topology, everywhere
from hpckit.run.job import Backend
from hpckit.settings import Settings

PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)

_device: Any = None


def device() -> Any:
    """This rank's torch device (CPU until a run has set it)."""
    import torch

    return _device if _device is not None else torch.device("cpu")


class TorchBackend(Backend):
    """Every rank joins one torch.distributed process group (NCCL on GPUs, Gloo on CPUs)."""

    def setup(self, comm: Any, local_comm: Any, topology: Topology, scaling: ScalingConfig,
              settings: Settings) -> None:
        setup(comm, local_comm, topology, scaling, settings, PROCESS_GROUP_TIMEOUT)


def setup(comm: Any, local_comm: Any, topology: Topology, scaling: ScalingConfig,
          settings: Settings, timeout: timedelta) -> Any:
    """Pick this rank's device, set its threads, and join the process group; returns the device."""
    global _device
    import torch
    import torch.distributed as dist

    visible = local_comm.allgather(settings.cuda_visible_devices)
    _device = everywhere(comm, lambda: _choose_device(topology, scaling, visible),
                         "choosing devices", LaunchError)[comm.rank]
    if not scaling.use_gpu:
        threads = cpu_threads(scaling.cpus_per_worker, len(os.sched_getaffinity(0)), topology.local_size)
        torch.set_num_threads(threads)
    if dist.is_initialized():
        return _device
    store = None
    if comm.rank == 0:
        store = dist.TCPStore(_rendezvous_host(topology, settings), 0, topology.world_size,
                              is_master=True, timeout=timeout, wait_for_workers=False)
    host, port = comm.bcast((store.host, store.port) if store else None, root=0)
    if store is None:
        store = dist.TCPStore(host, port, topology.world_size, is_master=False, timeout=timeout)
    backend = "nccl" if scaling.use_gpu else "gloo"
    dist.init_process_group(backend, store=store, rank=comm.rank, world_size=comm.size,
                            timeout=timeout)
    log.debug("process group %s ready at %s:%d", backend, host, port)
    return _device


def _choose_device(topology: Topology, scaling: ScalingConfig, visible: list[str | None]) -> Any:
    import torch

    if not scaling.use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LaunchError(
            f"ScalingConfig(use_gpu=True) but rank {topology.world_rank} on {topology.hostname} "
            "sees no CUDA device (torch.cuda.is_available() is False); run on GPU nodes, install "
            "a CUDA build of torch, or set use_gpu=False.")
    ids = assign_gpus(topology.local_rank, topology.local_size, scaling.gpus_per_worker,
                      torch.cuda.device_count(), visible, topology.hostname)
    torch.cuda.set_device(ids[0])
    return torch.device("cuda", ids[0])


def _rendezvous_host(topology: Topology, settings: Settings) -> str:
    if settings.master_addr:
        return settings.master_addr
    if topology.num_nodes == 1:
        return "127.0.0.1"
    return socket.getfqdn()
