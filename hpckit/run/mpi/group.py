"""The ranks of a run as MPI sees them: every rank (``world``), the ranks of this rank's node
(``node``) and one rank per node (``leaders``), and where this rank sits among them.

The run core passes a :class:`Group` wherever it needs more than one communicator: the node's
ranks share a node-local cache and its devices, and the node leaders speak for their nodes.
The collective steps themselves (:mod:`~hpckit.run.mpi.comm`, :mod:`~hpckit.run.mpi.waiting`)
take the communicator they run on.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpckit.run.mpi import progress

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


@dataclass(frozen=True)
class Topology:
    world_rank: int
    world_size: int
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int
    hostname: str


@dataclass(frozen=True)
class Group:
    """``world``: every rank of the run; ``node``: the ranks on this rank's node; ``leaders``:
    the first rank of each node, None on the others. Made by :func:`discover`, collectively;
    the communicators are this group's own (freed by :meth:`free`, collectively)."""

    world: Comm
    node: Comm
    leaders: Comm | None
    topology: Topology
    members: tuple[int, ...] = ()
    """The world ranks of this node's ranks, in the node's order."""

    @property
    def rank(self) -> int:
        return self.topology.world_rank

    @property
    def size(self) -> int:
        return self.topology.world_size

    def free(self) -> None:
        """Collective over the world: the node's and the leaders' communicators (the world is
        whoever made it's to free)."""
        if self.leaders is not None:
            progress.free(self.leaders)
        progress.free(self.node)


def discover(world: Comm, ranks_per_node: int | None = None) -> Group:
    """Collective: this rank's place in ``world``, its node's ranks and the node leaders.
    A node is the ranks that share memory, or with ``ranks_per_node`` (one machine standing
    for several nodes in tests) each run of that many consecutive ranks."""
    from mpi4py import MPI

    node = (world.Split(world.rank // ranks_per_node, world.rank) if ranks_per_node
            else world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank))
    split = world.Split(0 if node.rank == 0 else MPI.UNDEFINED, world.rank)
    leaders = split if split != MPI.COMM_NULL else None
    place = (leaders.rank, leaders.size) if leaders is not None else None
    node_rank, num_nodes = node.bcast(place, root=0)
    topology = Topology(world.rank, world.size, node.rank, node.size, node_rank, num_nodes,
                        socket.gethostname())
    return Group(world, node, leaders, topology, tuple(node.allgather(world.rank)))
