"""Stop requests: a signal (Slurm's time-limit or preemption warning) asks the run to stop.

The handler only sets a flag. The ranks agree on it at the next report() (the flag rides
on the announcement every rank sends anyway), so they all stop after the same checkpoint.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hpckit.errors import ConfigError

# SIGUSR2 by default: NCCL may use SIGUSR1 itself (submitit made the same choice).
DEFAULT_SIGNAL = "SIGUSR2"
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request; run again (or requeued) to continue

_received: str | None = None


class StopRequested(BaseException):
    """Raised in every rank after the checkpoint that follows an agreed stop is committed.

    A BaseException, so that a training loop's ``except Exception`` does not swallow it.
    """


def parse_signal(name: str | None) -> signal.Signals:
    text = (name or DEFAULT_SIGNAL).strip().upper()
    if text.isdigit():
        try:
            return signal.Signals(int(text))
        except ValueError:
            pass
    else:
        try:
            return signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
        except KeyError:
            pass
    raise ConfigError(
        f"HPCKIT_STOP_SIGNAL={name!r} is not a signal; use a name such as USR2, USR1 or TERM "
        "(match it to sbatch --signal=USR2@120).")


def received() -> str | None:
    """The name of the stop signal this process received, if any."""
    return _received


@contextmanager
def handling(name: str | None) -> Iterator[signal.Signals]:
    """Install the stop-signal handler for the duration of a run (main thread only)."""
    global _received
    signum = parse_signal(name)
    _received = None

    def handler(number: int, _frame: Any) -> None:
        global _received
        _received = signal.Signals(number).name

    try:
        previous = signal.signal(signum, handler)
    except ValueError:  # not the main thread: stop requests cannot be handled here
        yield signum
        return
    try:
        yield signum
    finally:
        signal.signal(signum, previous)
