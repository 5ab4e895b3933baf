"""The stop signal caught from the first line of a rank's script, before anything is imported.

``hpckit-early.pth``, installed into site-packages with hpckit, runs this file as Python
starts, in a process that srun or mpiexec launched (and not when ``HPCKIT_EARLY_STOP=0``).
A script that imports torch first would otherwise die of Slurm's warning (SIGUSR1/SIGUSR2
end a process by default) until ``import hpckit`` installs its handler, a second or a minute
later on a loaded filesystem. The handler only notes the signal in ``sys``; ``import hpckit``
takes it over (:func:`hpckit.run.ending.stop.catch_early`), and the run stops at its first
report as for a signal that came later. SIGTERM, and any stop signal other than SIGUSR1 and
SIGUSR2, is left alone: a process that never imports hpckit must still end on it.

Standalone: it imports nothing of hpckit (whose import takes about 0.3 s) and defines
nothing outside its own namespace.
"""

import os
import signal
import sys

WARNINGS = ("SIGUSR1", "SIGUSR2")


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


if __name__ == "hpckit_early":
    install()
