"""Which MPI implementation mpi4py loads, and the ``srun --mpi=`` plugin its processes speak.

Open MPI 5 speaks PMIx only; MPICH and Intel MPI speak PMI-2 (and PMIx where they were built
with it). A task started with a plugin its MPI does not speak runs as a world of one."""

from __future__ import annotations

import subprocess
import sys

SRUN_MPI = {"MPICH": "pmi2", "Cray MPICH": "cray_shasta", "Intel MPI": "pmi2",
            "Open MPI": "pmix"}
DEFAULT_SRUN_MPI = "pmi2"

# MPI_Get_library_version may be called before MPI_Init, so the answer costs no MPI start-up.
_ASK = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
        "print(MPI.Get_library_version())")


def implementation(text: str) -> str | None:
    """Which MPI a library's or a launcher's version text names (None: not one we know)."""
    lowered = text.lower()
    if "open mpi" in lowered or "open-mpi" in lowered:
        return "Open MPI"
    if "intel(r) mpi" in lowered or "intel mpi" in lowered:
        return "Intel MPI"
    if "cray mpich" in lowered:
        return "Cray MPICH"
    if "mpich" in lowered or "hydra" in lowered:
        return "MPICH"
    return None


def loaded_version(python: str | None = None) -> str:
    """The first line of the version text of the MPI library that mpi4py loads (in this
    process, or under the interpreter ``python``), without its build details. In a process
    that has not imported mpi4py's MPI, a child Python answers, so that this process's MPI is
    left to start (or not) as it would have."""
    if python is None and "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        return _first_line(str(MPI.Get_library_version()))
    return answer(ask(python))


def ask(python: str | None = None) -> subprocess.Popen[str]:
    """Start a child Python that prints its MPI library's version (see :func:`answer`), so
    that the caller can do other work meanwhile."""
    return subprocess.Popen([python or sys.executable, "-c", _ASK], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def answer(asked: subprocess.Popen[str]) -> str:
    """What the child started by :func:`ask` printed, as :func:`loaded_version` gives it."""
    try:
        out, _ = asked.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        asked.kill()
        raise
    if asked.returncode != 0:
        raise subprocess.CalledProcessError(asked.returncode, asked.args, out)
    return _first_line(out)


def _first_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return " ".join(first.split(", package:")[0].split())  # Open MPI goes on with its build


def srun_plugin(version: str | None = None, python: str | None = None) -> str:
    """The ``srun --mpi=`` value for the MPI whose version text is ``version`` (default: the
    one mpi4py loads, under ``python`` where given); pmi2 where the MPI cannot be told."""
    try:
        text = loaded_version(python) if version is None else version
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_SRUN_MPI
    return SRUN_MPI.get(implementation(text) or "", DEFAULT_SRUN_MPI)
