"""Ctrl-C while ranks wait in one of hpckit's steps for a rank that never comes (as one
that the same Ctrl-C stopped first): rank 1 stays away, ranks 0 and 2 enter all_reduce, and
SIGINT reaches rank 0 alone. Rank 0 must stop where it waits, and rank 2, which waits for
rank 0's result, must stop too. Each prints what happened; then all meet and exit 0. With a
second argument N, the step gathers through node leaders, each N ranks standing for a node."""

from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI

import hpckit  # noqa: F401  (first, as always: it sets up what MPI needs)
from hpckit.run.ending.exit import finalize_with_hydra
from hpckit.run.mpi.comm import all_reduce
from hpckit.run.mpi.group import discover
from hpckit.run.mpi.waiting import wait_for_all

comm = MPI.COMM_WORLD.Dup()
meeting = MPI.COMM_WORLD.Dup()
ready = sys.argv[1]
ranks = discover(comm, int(sys.argv[2])) if len(sys.argv) > 2 else comm
if comm.rank == 1:
    print("rank 1 stays away", flush=True)
else:
    if comm.rank == 0:
        with open(ready + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(ready + ".tmp", ready)
    started = time.monotonic()
    try:
        all_reduce(ranks, "a step rank 1 never joins", lambda: comm.rank, sum)
        print(f"rank {comm.rank} completed the step", flush=True)
    except KeyboardInterrupt:
        print(f"rank {comm.rank} interrupted after {time.monotonic() - started:.1f} s", flush=True)
wait_for_all(meeting)
finalize_with_hydra()
os._exit(0)
