"""Each of hpckit's kinds of step, then every rank waits outside MPI until every other rank
has returned from that step, as torch's TCP store and DDP's first all-reduce make a rank
wait after hpckit's start-up or a report (#64). Rank 0 listens on a socket; the others
connect once they have returned. A step that does not keep MPI progressing on the rank that
left it first hangs here over MPICH's OFI network module between nodes, since the peers
still need that rank's MPI calls to receive its bytes.

Prints ``ROUND n OK`` on rank 0 after each round, ``PROGRESS DONE`` at the end."""

from __future__ import annotations

import socket
import sys

from mpi4py import MPI

from hpckit.run.mpi import comm as steps
from hpckit.run.mpi.group import discover
from hpckit.run.mpi.waiting import from_root, quiet_everywhere, share, wait_for_all

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def outside_mpi(world: MPI.Comm, port: int, listener: socket.socket | None) -> None:
    """Until every rank has returned from the step: rank 0 accepts every other rank."""
    if listener is not None:
        for _ in range(world.size - 1):
            listener.accept()[0].close()
    else:
        socket.create_connection(("127.0.0.1", port), timeout=600).close()


def main() -> None:
    world = MPI.COMM_WORLD
    listener = None
    if world.rank == 0:
        listener = socket.create_server(("127.0.0.1", 0), backlog=world.size)
    # The first step of all, as in a run's start: the connections between nodes are made
    # inside it.
    port = from_root(world, listener.getsockname()[1] if listener else None)
    outside_mpi(world, port, listener)
    group = discover(world)
    kinds = {
        "from_root": lambda: from_root(world, "x" * 100_000),
        "share": lambda: share(world, world.rank),
        "everywhere": lambda: steps.everywhere(world, lambda: world.rank, "a step"),
        "quiet": lambda: quiet_everywhere(world, 1, True),
        "all_reduce": lambda: steps.all_reduce(group, "a report", lambda: b"y" * 50_000, len),
        "barrier": lambda: wait_for_all(world),
    }
    for round_ in range(ROUNDS):
        for kind, step in kinds.items():
            step()
            outside_mpi(world, port, listener)
            if world.rank == 0:
                print(f"ROUND {round_} {kind} OK", flush=True)
    group.free()
    print(f"PROGRESS DONE rank {world.rank}", flush=True)


if __name__ == "__main__":
    main()
