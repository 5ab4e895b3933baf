"""What a rank must settle before anything is imported: the stop signal, and MPICH's network
module under Slurm's PMI server.

``hpckit-early.pth``, installed into site-packages with hpckit, runs this file as Python
starts, in a process that srun or mpiexec launched (and not when ``HPCKIT_EARLY_STOP=0``).
A script that imports torch first would otherwise die of Slurm's warning (SIGUSR1/SIGUSR2
end a process by default) until ``import hpckit`` installs its handler, a second or a minute
later on a loaded filesystem. The handler only notes the signal in ``sys``; ``import hpckit``
takes it over (:func:`hpckit.run.ending.stop.catch_early`), and the run stops at its first
report as for a signal that came later. SIGTERM, and any stop signal other than SIGUSR1 and
SIGUSR2, is left alone: a process that never imports hpckit must still end on it.

Under ``srun --mpi=pmi2`` the rank's MPICH (the ``mpich`` wheel) speaks PMI-1 to
slurmstepd, which reads each request in a single read of at most 1,024 bytes. MPICH puts
the UCX network module's addresses in values of up to 1,022 characters; with the command and
key around one, a request is up to about 1,080 bytes. How long depends on the bytes (runs of
zeros are shortened), and MPICH sends a whole buffer whose tail holds whatever the rank's
heap held before, so whether a job of two nodes or more starts depends on what the rank did
before MPI_Init: slurmstepd takes the first 1,024 bytes for one request and the rest for the
next ("value not properly terminated", "request not begin with 'cmd='") and the job hangs
or UCX aborts on a mangled address. So in a rank of several nodes whose PMI_FD leads to
slurmstepd, MPICH's OFI network module is chosen (its addresses take a few dozen
characters), unless ``MPIR_CVAR_CH4_NETMOD`` is set already.

Standalone: it imports nothing of hpckit (whose import takes about 0.3 s) and defines
nothing outside its own namespace.
"""

import os
import signal
import sys
from collections.abc import Mapping, MutableMapping

WARNINGS = ("SIGUSR1", "SIGUSR2")
NETMOD = "MPIR_CVAR_CH4_NETMOD"
SLURM_PMI_SERVER = "slurmstepd"


def stop_signal(text: str) -> "signal.Signals | None":
    """HPCKIT_STOP_SIGNAL's value, where it names one of the warning signals."""
    text = text.strip().upper()
    if text.isdigit():
        found = next((s for s in signal.Signals if s.value == int(text)), None)
    else:
        found = getattr(signal.Signals, text if text.startswith("SIG") else f"SIG{text}", None)
    return found if found is not None and found.name in WARNINGS else None


def noted(number: int, frame: object) -> None:
    sys.hpckit_stop_received = signal.Signals(number).name  # type: ignore[attr-defined]


noted.hpckit_early = True  # type: ignore[attr-defined]


def install() -> None:
    number = stop_signal(os.environ.get("HPCKIT_STOP_SIGNAL", "USR2"))
    # Ignored counts as unhandled, as for hpckit itself: a parent that ignored it (hpckit
    # run starts mpiexec so) wants the rank not to die of it, and noting it keeps it too.
    if number is not None and signal.getsignal(number) in (signal.SIG_DFL, signal.SIG_IGN):
        signal.signal(number, noted)
        sys.hpckit_early_hook = number.name  # type: ignore[attr-defined]


def choose_mpich_network(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Choose MPICH's OFI network module where Slurm's PMI server would cut its requests
    (see above); whether it did."""
    try:
        nodes = int(environ.get("SLURM_STEP_NUM_NODES", "1"))
    except ValueError:
        return False
    if NETMOD in environ or nodes < 2 or not from_slurm_pmi_server(environ):
        return False
    environ[NETMOD] = "ofi"
    return True


def from_slurm_pmi_server(environ: Mapping[str, str]) -> bool:
    """Whether the process at the other end of ``PMI_FD`` is slurmstepd (and not, say,
    hydra's proxy under an mpiexec inside the allocation)."""
    import socket
    import struct

    fd = environ.get("PMI_FD", "")
    if not fd.isdigit() or "SLURM_STEP_ID" not in environ:
        return False
    try:
        with socket.socket(fileno=os.dup(int(fd))) as connection:
            credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                struct.calcsize("3i"))
        with open(f"/proc/{struct.unpack('3i', credentials)[0]}/comm") as f:
            return f.read().strip() == SLURM_PMI_SERVER
    except OSError:
        return False


if __name__ == "hpckit_early":
    install()
    choose_mpich_network()
