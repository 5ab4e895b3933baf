"""torch.distributed for the MPI world: device choice and a rendezvous agreed over MPI.

Where the ranks meet to start torch.distributed: rank 0's TCP store, at an address checked
from every rank before the others make their stores.

torch's store retries an address it cannot reach for its whole timeout (30 minutes by
default, with IPv6 warnings where a name does not resolve); the check makes that one error
within seconds, on every rank, that names ``HPCKIT_MASTER_ADDR``.

Which GPUs and how many CPU threads each rank gets: pure functions, tested on simulated
nodes without GPUs.

As Ray gives each worker its own ``CUDA_VISIBLE_DEVICES``, hpckit narrows every rank's to the
devices it trains on before CUDA starts, so that a rank sees them as ``cuda:0``, ``cuda:1``,
… and frameworks that count devices (Lightning's ``devices="auto"``) count only its own.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hpckit.config import ScalingConfig
from hpckit.errors import LaunchError
from hpckit.integrations.torch.config import TorchConfig
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
        from hpckit.integrations.torch.loader import random_keepers

        return random_keepers()


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
    host, port = from_root(group.world, (rendezvous_host(topology, settings), store.port)
                           if store else None)
    everywhere(group.world, lambda: check_rendezvous(host, port, topology),
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


ANSWER_TIMEOUT_S = 10.0
FIX = ("Set HPCKIT_MASTER_ADDR to an address of rank 0's node that every node reaches (in a "
       "batch script: export HPCKIT_MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\""
       " | head -n 1), or that node's address on the fast network).")


def rendezvous_host(topology: Topology, settings: Settings) -> str:
    """The address the other ranks reach rank 0's store at, chosen on rank 0."""
    if settings.master_addr:
        return settings.master_addr
    if topology.num_nodes == 1:
        return "127.0.0.1"
    return socket.getfqdn()


def check_rendezvous(address: str, port: int, topology: Topology,
          timeout: float = ANSWER_TIMEOUT_S) -> None:
    """Raise a LaunchError unless this rank resolves ``address`` and its store answers there."""
    where = f"rank {topology.world_rank} on {topology.hostname}"
    try:
        socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise LaunchError(f"{where}: the rendezvous address {address!r} does not resolve "
                          f"({exc.strerror or exc}). {FIX}") from None
    try:
        with socket.create_connection((address, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or f"no answer within {timeout:g} s"
        raise LaunchError(f"{where}: rank 0's store at {address}:{port} does not answer "
                          f"({reason}). {FIX}") from None


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
