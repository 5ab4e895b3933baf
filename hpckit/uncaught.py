"""How an error that nobody catches ends a program that uses hpckit.

Python prints a traceback for an uncaught exception, in every rank of an MPI job: a failed
start-up under ``mpirun -n 4`` used to print four interleaved tracebacks of hpckit's own
frames. With the hook that ``import hpckit`` installs:

- an hpckit error prints one line, ``hpckit: error: ...`` (its message names the fix), from
  one rank: an error every rank raised together, or a config object's rejection of its
  arguments, is printed by rank 0 only, and an error that the launching process reports (a
  rank hpckit started) is not printed by the rank;
- an interrupt (Ctrl-C) that hpckit has already reported in one line prints nothing more;
- everything else, and everything with ``HPCKIT_LOG_LEVEL=DEBUG``, goes to the hook that
  was there before (Python's traceback).

The exception is still raised, so ``except`` clauses (a Ray program's included) see it as
before; only what reaches the top of the program is printed differently.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

from hpckit import settings
from hpckit.errors import ConfigError, HpckitError

# Marks an exception whose message is shown elsewhere (by rank 0, by the launching process)
# or was already shown (an interrupt's one line). An attribute, since built-in exceptions
# such as KeyboardInterrupt take no weak references.
_SHOWN = "_hpckit_shown_elsewhere"
_previous = sys.excepthook


def shown_elsewhere(error: BaseException) -> BaseException:
    """Print nothing for ``error`` if it reaches the top of the program."""
    setattr(error, _SHOWN, True)
    return error


def say_now(error: BaseException) -> BaseException:
    """Print ``error``'s one line now, not when it reaches the top of the program: a rank
    whose peers may end it first (mpiexec kills the ranks still running when one exits with
    an error status) says it before they can."""
    sys.stderr.write(f"hpckit: error: {error}\n")
    sys.stderr.flush()
    return shown_elsewhere(error)


def install() -> None:
    """Make :func:`hook` the program's excepthook (once), keeping the one before it."""
    global _previous
    if sys.excepthook is not hook:
        _previous = sys.excepthook
        sys.excepthook = hook


def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    try:
        current = settings.current()
    except HpckitError:
        current = settings.Settings()
    if current.log_level == "DEBUG":
        _previous(kind, error, trace)
    elif getattr(error, _SHOWN, False):
        pass
    elif isinstance(error, HpckitError):
        if not (_same_everywhere(error, trace) and current.launched_rank not in ("0", "?")):
            sys.stderr.write(f"hpckit: error: {error}\n")
    else:
        _previous(kind, error, trace)
    status = getattr(error, "exit_status", None)
    if isinstance(status, int):  # a stopped run: the status says "continue later"
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _same_everywhere(error: BaseException, trace: TracebackType | None) -> bool:
    """A config object that rejected its arguments (``ScalingConfig(num_workers=0)``): every
    rank built it alike and raised alike, so rank 0 alone says what is wrong. Other errors
    (a file one node cannot read) may be a single rank's: each rank prints its own."""
    if not isinstance(error, ConfigError) or trace is None:
        return False
    while trace.tb_next is not None:
        trace = trace.tb_next
    return str(trace.tb_frame.f_globals.get("__name__")).startswith("hpckit.config")
