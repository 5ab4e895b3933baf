"""torch.distributed for the MPI world: device choice and a rendezvous agreed over MPI."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from hpckit.config import ScalingConfig
from hpckit.errors import LaunchError
from hpckit.integrations.torch import rendezvous
from hpckit.integrations.torch.config import TorchConfig
from hpckit.integrations.torch.devices import GpuShare, cpu_threads, share_gpus
from hpckit.logs import log
from hpckit.run.job import Backend
from hpckit.run.mpi.comm import everywhere
from hpckit.run.mpi.group import Group, Topology
from hpckit.run.mpi.waiting import from_root, share
from hpckit.settings import Settings

_devices: list[Any] = []


def device() -> Any:
    """This rank's torch device (CPU until a run has set it)."""
    import torch

    return _devices[0] if _devices else torch.device("cpu")


def devices() -> list[Any]:
    """Every device of this rank (``ScalingConfig(resources_per_worker={"GPU": 2})`` gives
    two), as Ray's ``get_devices``; ``[cpu]`` without GPUs."""
    import torch

    return list(_devices) or [torch.device("cpu")]


class TorchBackend(Backend):
    """Every rank joins one torch.distributed process group (NCCL on GPUs, Gloo on CPUs,
    unless ``TorchConfig(backend=...)`` says)."""

    def __init__(self, config: TorchConfig | None = None) -> None:
        self.config = config or TorchConfig()

    def setup(self, group: Group, scaling: ScalingConfig, settings: Settings) -> None:
        setup(group, scaling, settings, self.config)

    def keepers(self) -> dict[str, Any]:
        from hpckit.integrations.torch.streams import keepers

        return keepers()


def setup(group: Group, scaling: ScalingConfig, settings: Settings, config: TorchConfig) -> Any:
    """Pick this rank's devices, set its threads, and join the process group; returns the
    device."""
    global _devices
    import torch
    import torch.distributed as dist

    topology = group.topology
    # What each rank of the node was given: its devices and its CPUs, in one exchange.
    node = share(group.node, (settings.cuda_visible_devices, sorted(os.sched_getaffinity(0))))
    visible = [devices for devices, _ in node]
    _devices = everywhere(group.world, lambda: _choose_devices(topology, scaling, visible),
                          "choosing devices", LaunchError)[group.rank]
    timeout = timedelta(seconds=config.timeout_s)
    if not scaling.use_gpu:
        masks = [frozenset(cpus) for _, cpus in node]
        threads = cpu_threads(scaling.cpus_per_worker, masks, topology.local_rank,
                              settings.slurm_cpus_per_task)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # Accelerate would reset an unset one
    if not dist.is_initialized():
        backend = config.backend or ("nccl" if scaling.use_gpu else "gloo")
        _join(group, settings, backend, timeout)
    return _devices[0]


def _join(group: Group, settings: Settings, backend: str, timeout: timedelta) -> None:
    """Join the process group through a TCP store whose address goes over MPI, and set the
    variables torch's launchers set (Ray sets them too): Accelerate, and with it the
    Transformers Trainer, tell from them that the process group is theirs to use."""
    import torch.distributed as dist

    topology = group.topology
    store = None
    if group.rank == 0:  # it listens on every interface; its own client needs no network
        store = dist.TCPStore("127.0.0.1", 0, topology.world_size, is_master=True,
                              timeout=timeout, wait_for_workers=False)
    host, port = from_root(group.world, (rendezvous.host(topology, settings), store.port)
                           if store else None)
    everywhere(group.world, lambda: rendezvous.check(host, port, topology),
               "reaching the rendezvous", LaunchError)
    if store is None:
        store = dist.TCPStore(host, port, topology.world_size, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=group.rank, world_size=group.size,
                            timeout=timeout)
    log.debug("process group %s ready at %s:%d", backend, host, port)
    os.environ.update({"RANK": str(topology.world_rank), "WORLD_SIZE": str(topology.world_size),
                       "LOCAL_RANK": str(topology.local_rank),
                       "LOCAL_WORLD_SIZE": str(topology.local_size),
                       "NODE_RANK": str(topology.node_rank), "MASTER_ADDR": host,
                       "MASTER_PORT": str(port)})


def _choose_devices(topology: Topology, scaling: ScalingConfig,
                    visible: list[str | None]) -> list[Any]:
    import torch

    if not scaling.use_gpu:
        return [torch.device("cpu")]
    count = torch.cuda.device_count()  # counted through NVML: CUDA does not start
    if count == 0:
        raise LaunchError(
            f"ScalingConfig(use_gpu=True) but rank {topology.world_rank} on {topology.hostname} "
            "sees no CUDA device (torch.cuda.device_count() is 0); run on GPU nodes, install "
            "a CUDA build of torch, or set use_gpu=False.")
    share = share_gpus(topology.local_rank, topology.local_size, scaling.gpus_per_worker,
                       count, visible, topology.hostname)
    ids = _narrowed(share, topology.world_rank)
    torch.cuda.set_device(ids[0])
    return [torch.device("cuda", i) for i in ids]


def _narrowed(share: GpuShare, rank: int) -> list[int]:
    """Give this rank only its own devices, as Ray does; where CUDA has started already the
    list can no longer change, and the rank uses its devices among all it sees."""
    import torch

    if not torch.cuda.is_initialized() or os.environ.get("CUDA_VISIBLE_DEVICES") == share.visible:
        os.environ["CUDA_VISIBLE_DEVICES"] = share.visible  # a second fit() finds it so
        return list(range(len(share.entries)))
    log.warning(
        "rank %d started CUDA before fit() (torch.cuda.is_initialized() is True), so hpckit "
        "cannot narrow its CUDA_VISIBLE_DEVICES to its own GPU(s) %s: it trains on cuda:%d "
        "but still sees every device, and frameworks that count devices (Lightning's "
        "devices='auto') count them all. Move the CUDA calls into the training function.",
        rank, share.visible, share.first)
    return list(range(share.first, share.first + len(share.entries)))
