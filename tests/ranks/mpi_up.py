"""Starts MPI and says so, with the network module MPICH was told to use."""

import os

from mpi4py import MPI

MPI.COMM_WORLD.Barrier()
print(f"MPI UP rank {MPI.COMM_WORLD.rank} netmod {os.environ.get('MPIR_CVAR_CH4_NETMOD')}",
      flush=True)
