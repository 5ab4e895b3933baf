"""The hpckit exception hierarchy: every error hpckit raises is a :class:`HpckitError`.

Where Ray Train raises a type of its own, hpckit's error is that type too (by name and by
the built-in base Ray uses), so a Ray program's ``except`` clauses still catch it:
``TrainingFailedError`` > ``WorkerGroupError``, ``ControllerError``, ``PreemptionError``;
``RuntimeError`` for a missing experiment or checkpoint.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from hpckit import exits

__all__ = [
    "HpckitError",
    "ConfigError",
    "StorageError",
    "ManifestError",
    "MetricsError",
    "CheckpointError",
    "CommitError",
    "ReportMismatchError",
    "LaunchError",
    "TrainingFailedError",
    "WorkerGroupError",
    "ControllerError",
    "PreemptionError",
    "ExperimentLockedError",
    "ExperimentTakenError",
]


def hpckit_clone() -> str | None:
    """The clone this hpckit runs from (an editable install), else None. hpckit is not on
    PyPI: it is installed from a clone, which is where extras are added and bugs reported."""
    clone = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return clone if os.path.isfile(os.path.join(clone, "setup.cfg")) else None


def how_to_report() -> str:
    """Where a bug in hpckit goes and what to send. There is no public tracker: the issues of
    the repository that the clone was made from."""
    clone = hpckit_clone()
    remote = f"git -C {clone} remote -v" if clone else "git remote -v in hpckit's clone"
    return (f"report it on the issue tracker of the repository hpckit was cloned from ({remote} "
            "names it) with the command, the traceback (--debug, or HPCKIT_LOG_LEVEL=DEBUG for a "
            "run) and the output of python -m hpckit doctor")


class HpckitError(Exception):
    """Base class of every error raised by hpckit."""

    recurs: ClassVar[bool] = False
    """A refusal of the program's own input (a configuration, metrics that are not JSON,
    ranks that disagree on report()): a restart from the same checkpoint meets it again, so
    it is never restarted, whatever ``FailureConfig(max_failures)`` allows."""


class ConfigError(HpckitError, ValueError):
    """A configuration value is invalid; the message names it and what is accepted."""

    recurs = True


class StorageError(HpckitError, OSError):
    """Storage could not be read or written; the message names the location."""


class ManifestError(HpckitError, RuntimeError):
    """An experiment's manifest is unreadable, invalid or from a newer hpckit."""


class MetricsError(HpckitError, TypeError):
    """Reported metrics cannot be stored as JSON; the message names the key."""

    recurs = True


class CheckpointError(HpckitError, RuntimeError):
    """A checkpoint directory is missing, malformed or clashes with another rank's."""


class CommitError(HpckitError):
    """A report's checkpoint could not be committed; raised identically on every rank."""


DEFECT = "this is a defect of hpckit"


class ProtocolError(CommitError):
    """hpckit's own state diverged from what its protocol guarantees (a defect of hpckit, not
    of the program): the message names what diverged. Raised where ``assert`` would vanish
    under ``python -O``."""

    def __init__(self, what: str) -> None:
        # Said once, however often the message is wrapped, re-raised or pickled.
        super().__init__(what if DEFECT in what else f"{what}; {DEFECT}: {how_to_report()}")


class ReportMismatchError(CommitError):
    """Ranks disagree on how many times they called ``report()``."""

    recurs = True


class LaunchError(HpckitError):
    """Ranks could not be started, or the launched world disagrees with the config."""


class NoSpareNode(LaunchError):
    """A node of the run was lost and the allocation has none left to take its place."""


class ExperimentClosedError(HpckitError):
    """A change asked of an experiment after its attempt closed it: refused. Raised in the
    thread that asked (a validation that outlived its attempt), never at a report."""


class AttemptFailed(Exception):
    """The training function failed on this rank (or every rank) during an attempt: what
    the attempt raises to the loop that may start another (not one of hpckit's errors
    itself: it carries the ``cause``, which is what the user sees)."""

    def __init__(self, cause: BaseException, collective: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.collective = collective


class TrainingFailedError(HpckitError):
    """Training failed (after any retries); the message names the failed ranks."""


class WorkerGroupError(TrainingFailedError):
    """Training failed on one or more ranks (Ray's name): ``worker_failures`` maps each failed
    world rank to its exception (as raised there, where it could be sent).

    Args:
        error_message: The message: ``training failed on ...``, naming the failed ranks.
        worker_failures: Each failed world rank mapped to its exception; empty where none
            could be named (a hung run).
    """

    def __init__(self, error_message: str, worker_failures: dict[int, BaseException]) -> None:
        super().__init__(error_message)
        self.worker_failures = worker_failures

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.worker_failures)


class ControllerError(TrainingFailedError):
    """hpckit's own machinery failed, not the training function (Ray's name; raised where
    the process that started the ranks fails): ``controller_failure`` is the cause.

    Args:
        controller_failure: The exception hpckit's machinery raised (such as a
            ``UserCallback``'s).
    """

    def __init__(self, controller_failure: BaseException) -> None:
        super().__init__(f"hpckit failed, not the training function: {controller_failure}")
        self.controller_failure = controller_failure

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.controller_failure,)


class PreemptionError(TrainingFailedError):
    """The job was told to end (Slurm's time-limit warning, a preemption) and was not
    requeued (Ray's name): ``preemption_info`` says when and which ranks. Uncaught, it ends
    the program with status 75 ("stopped, continue later"), as a stopped run always has.

    Args:
        preemption_info: The :class:`~hpckit.PreemptionInfo` of the stop.
        drain_timed_out: Ray's flag for a drain of the nodes that timed out; hpckit drains
            nothing and leaves it False (the default).
    """

    exit_status = exits.STOPPED

    def __init__(self, preemption_info: Any, drain_timed_out: bool = False) -> None:
        super().__init__(f"the job was preempted: {preemption_info}")
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.preemption_info, self.drain_timed_out)


class ExperimentLockedError(HpckitError):
    """Another live run holds the experiment: two writers would corrupt its history."""


class ExperimentTakenError(ExperimentLockedError, TrainingFailedError):
    """This run lost the experiment's lock (it was frozen, or its storage unreachable, past
    ``HPCKIT_LOCK_STALE_SECONDS``, and another run took the experiment over): it wrote nothing
    more. Raised on every rank at the next ``report()``; the message names the run that took
    the experiment. An ``ExperimentLockedError`` (another run holds it) and a
    ``TrainingFailedError`` (what ``fit()`` raises when training failed, as in Ray). Never
    restarted by ``FailureConfig(max_failures)`` or ``hpckit run --max-failures``, since a
    restart would contend with the run that owns the experiment now; uncaught, it ends the
    program with status 77 (``EX_NOPERM``: this run may no longer write the experiment)."""

    exit_status = exits.TAKEN
