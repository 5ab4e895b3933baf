"""Telling MPICH's mpiexec (hydra) that a rank is done with MPI when MPI_Finalize cannot run.

Hydra ends every rank of a job as soon as one exits without having finalized MPI, and prints
a "BAD TERMINATION" banner for each rank it had to kill. After Ctrl-C the ranks exit without
MPI_Finalize (a collective may have been left half done; finalizing would fail or wait) at
about the same moment, but not the same one, and a rank a few milliseconds late was killed.
So each rank first says ``finalize`` on its PMI-1 connection to hydra, as MPI_Finalize does
at its end; hydra then takes each rank's own exit status and kills nothing. Only on hydra's
connection: Slurm's PMI-2 (srun) speaks another protocol on its PMI_FD and is left alone.
"""

from __future__ import annotations

import os
import select
import socket
import struct

from hpckit.processes import stat

ACK_WAIT_S = 1.0
HYDRA_PROXY = "hydra_pmi_proxy"


def finalize_with_hydra() -> bool:
    """Whether hydra acknowledged this rank's finalize; False, with nothing sent, where the
    rank was not started by hydra."""
    fd = hydra_connection()
    if fd is None:
        return False
    try:
        os.write(fd, b"cmd=finalize\n")
        ready, _, _ = select.select([fd], [], [], ACK_WAIT_S)
        return bool(ready) and os.read(fd, 256).startswith(b"cmd=finalize_ack")
    except OSError:
        return False


def hydra_connection() -> int | None:
    """``PMI_FD`` where hydra's proxy holds its other end; None elsewhere.

    The variables do not say who listens: a job submitted from inside an ``mpiexec`` rank
    inherits hydra's ``MPI_LOCALRANKID``, and under ``srun --mpi=pmi2`` slurmstepd holds
    ``PMI_FD``. Hydra's PMI-1 words on that connection are a malformed request to Slurm's
    PMI-2 server, so the socket's peer is asked instead."""
    fd = os.environ.get("PMI_FD", "")
    if not fd.isdigit():
        return None
    try:
        with socket.socket(fileno=os.dup(int(fd))) as connection:
            credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                struct.calcsize("3i"))
    except OSError:  # closed, or not a socket
        return None
    peer = stat(struct.unpack("3i", credentials)[0])
    return int(fd) if peer is not None and peer.name == HYDRA_PROXY else None
