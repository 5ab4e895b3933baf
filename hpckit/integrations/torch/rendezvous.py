"""Where the ranks meet to start torch.distributed: rank 0's TCP store, at an address checked
from every rank before the others make their stores.

torch's store retries an address it cannot reach for its whole timeout (30 minutes by
default, with IPv6 warnings where a name does not resolve); the check makes that one error
within seconds, on every rank, that names ``HPCKIT_MASTER_ADDR``.
"""

from __future__ import annotations

import socket

from hpckit.errors import LaunchError
from hpckit.run.mpi.group import Topology
from hpckit.settings import Settings

ANSWER_TIMEOUT_S = 10.0
FIX = ("Set HPCKIT_MASTER_ADDR to an address of rank 0's node that every node reaches (in a "
       "batch script: export HPCKIT_MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\""
       " | head -n 1), or that node's address on the fast network).")


def host(topology: Topology, settings: Settings) -> str:
    """The address the other ranks reach rank 0's store at, chosen on rank 0."""
    if settings.master_addr:
        return settings.master_addr
    if topology.num_nodes == 1:
        return "127.0.0.1"
    return socket.getfqdn()


def check(address: str, port: int, topology: Topology,
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
