"""Every exit status an hpckit process gives, and the one rule by which a loop that starts
ranks again (``python train.py``'s launcher, ``hpckit run``, a rank restarting itself, a
sweep's trial steps) tells a failure from an end it must keep: :func:`restarts_after`.

``docs/cli.md`` lists the statuses for people; ``tests/test_invariants.py`` checks that no
other module defines one.
"""

from __future__ import annotations

import signal

OK = 0
FAILED = 1  # the command ran and failed: a check failed, training failed, hpckit's error
USAGE = 2  # a bad argument or input, not an experiment, or an experiment in use
STORAGE = 3  # storage could not be read or written
STOPPED = 75  # EX_TEMPFAIL: stopped on request (requeued, or a PreemptionError): run again
TAKEN = 77  # another run took the experiment over: neither requeued nor restarted
HUNG = 124  # as timeout(1) ends a command that ran too long: the hang watchdog
INTERRUPTED = 128 + signal.SIGINT  # what a shell reports for Ctrl-C
BROKEN_PIPE = 128 + signal.SIGPIPE  # as a program killed by SIGPIPE: its reader stopped
TERMINATED = 128 + signal.SIGTERM  # ended after a second SIGTERM, before its next report
# The launcher was killed because it waited for lost ranks (or an elastic run gave its step
# up to grow): never a process's own status (0-255, or a negative signal number), so never
# taken for srun's 137 when a task was killed.
ABANDONED = 1000

KEPT = frozenset({OK, STOPPED, INTERRUPTED, TERMINATED, TAKEN})
"""The ends a retry loop keeps as they are: success, a stop, an interrupt, a termination,
and another run's takeover. Every other status is a failure, restarted as
``FailureConfig(max_failures)`` allows."""


def restarts_after(status: int) -> bool:
    """Whether ranks that ended with ``status`` failed, and so may be started again."""
    return status not in KEPT
