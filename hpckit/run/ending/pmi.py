"""Telling MPICH's mpiexec (hydra) that a rank is done with MPI when MPI_Finalize cannot run.

Hydra ends every rank of a job as soon as one exits without having finalized MPI, and prints
a "BAD TERMINATION" banner for each rank it had to kill. After Ctrl-C the ranks exit without
MPI_Finalize (a collective may have been left half done; finalizing would fail or wait) at
about the same moment, but not the same one, and a rank a few milliseconds late was killed.
So each rank first says ``finalize`` on its PMI-1 connection to hydra, as MPI_Finalize does
at its end; hydra then takes each rank's own exit status and kills nothing. Slurm's PMI-2
(srun) speaks another protocol on its PMI_FD and is left alone.
"""

from __future__ import annotations

import os
import select

ACK_WAIT_S = 1.0


def finalize_with_hydra() -> bool:
    """Whether hydra acknowledged this rank's finalize; False, with nothing sent, where the
    rank was not started by hydra."""
    fd = os.environ.get("PMI_FD", "")
    if not fd.isdigit() or "MPI_LOCALRANKID" not in os.environ:  # hydra sets both
        return False
    try:
        os.write(int(fd), b"cmd=finalize\n")
        ready, _, _ = select.select([int(fd)], [], [], ACK_WAIT_S)
        return bool(ready) and os.read(int(fd), 256).startswith(b"cmd=finalize_ack")
    except OSError:
        return False
