"""Validation on ranks set aside in the allocation (``ValidationConfig(ranks=N)``): the last
N launched ranks never train; each waits for rank 0 to send it a checkpoint, validates it in
a process of its own on its node, and answers with the outcome, until rank 0 says how the
run ended. Their messages travel on a duplicate of the launched world (the link), where
training rank 0 is rank 0 and the validation ranks come after the training ranks."""

from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hpckit.checkpoint import Checkpoint
from hpckit.config import ValidationConfig
from hpckit.errors import LaunchError, TrainingFailedError
from hpckit.experiment.manifest import FAILED, Validation
from hpckit.run.ending.exit import finalize_with_hydra
from hpckit.run.mpi.waiting import next_from, receive_from, send_to
from hpckit.run.validation import child

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

TASK, CANCEL, OUTCOME, END = 0x4856, 0x4857, 0x4858, 0x4859
POLL_S = 0.05


@dataclass(frozen=True)
class Pool:
    """Training rank 0's view of the validation ranks."""

    link: Comm
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Training:
    """A training rank: its communicator (the training ranks alone) and, on rank 0, the
    ranks set aside to validate."""

    comm: Comm
    pool: Pool | None


@dataclass(frozen=True)
class Validating:
    """A rank set aside to validate with ``config``."""

    pool: Pool
    config: ValidationConfig


def split_off(comm: Comm, training: int, config: ValidationConfig | None) -> Training | Validating:
    """Collective on ``comm``: this rank's part when the ranks after the first ``training``
    are set aside to validate (none where ``comm`` has no more)."""
    if config is None or comm.size == training:
        return Training(comm, None)
    link = comm.Dup()
    part = comm.Split(0 if comm.rank < training else 1, comm.rank)
    pool = Pool(link, tuple(range(training, comm.size)))
    return Training(part, pool) if comm.rank < training else Validating(pool, config)


@dataclass
class Ending:
    """How the run ended, for the ranks set aside (rank 0 of the training ranks tells them,
    once)."""

    pool: Pool | None
    result: Any = None
    told: bool = False

    def end(self, error: BaseException | None = None) -> None:
        """The validation ranks return ``result`` from ``fit()``, or raise ``error``."""
        if self.pool is None or self.told:
            return
        self.told = True
        how = ("raise", _sendable(error)) if error is not None else ("return", self.result)
        for rank in self.pool.ranks:
            send_to(self.pool.link, how, rank, END)


@contextlib.contextmanager
def ending(pool: Pool | None, rank: int) -> Iterator[Ending]:
    """Around a training rank's run: on rank 0, its end (a result, or what it raises)
    reaches the validation ranks; nothing on the others."""
    ended = Ending(pool if rank == 0 else None)
    try:
        yield ended
    except BaseException as exc:
        ended.end(exc)
        raise
    ended.end()


def check_threads(ranks: int) -> None:
    """Ranks set aside talk to rank 0's validation threads while rank 0 trains: MPI must
    serve several threads at once."""
    if not ranks:
        return
    from mpi4py import MPI

    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise LaunchError(f"ValidationConfig(ranks={ranks}) needs MPI_THREAD_MULTIPLE, which "
                          "this MPI was not started with (mpi4py.rc.thread_level or "
                          "MPI4PY_RC_THREAD_LEVEL); start it with 'multiple', or leave ranks "
                          "out to validate on rank 0's node.")


def _sendable(error: BaseException) -> BaseException:
    """``error``, or one that says the same where it cannot travel between ranks."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001  (any error's pickling may fail in its own way)
        return TrainingFailedError(f"{type(error).__name__}: {error}")


class Remote:
    """One validation sent to a validation rank; it runs there until it ends or is
    cancelled."""

    def __init__(self, pool: Pool, rank: int, checkpoint: Checkpoint,
                 validation: Validation) -> None:
        self.pool, self.rank = pool, rank
        send_to(pool.link, (checkpoint, validation), rank, TASK)

    def outcome(self) -> Validation | None:
        """How it ended; None when it was cancelled."""
        ended: Validation | None = receive_from(self.pool.link, self.rank, OUTCOME,
                                                longest=POLL_S)
        return ended

    def kill(self) -> None:
        send_to(self.pool.link, None, self.rank, CANCEL)

    def close(self) -> None:
        """Nothing here: the validation rank cleans up after itself."""


def serve(part: Validating, local_dir: str | None) -> Any:
    """A validation rank's part of ``fit()``: validate what rank 0 sends until the run ends;
    what the training ranks' ``fit()`` returns (or raises)."""
    config = replace(part.config, ranks=0)
    payload: str | OSError
    try:
        payload = child.made_payload(local_dir, config)
    except OSError as exc:  # every validation sent here fails, saying why
        payload = exc
    try:
        while True:
            tag, message = next_from(part.pool.link, 0, longest=POLL_S)
            if tag == END:
                kind, value = message
                if kind == "raise":
                    _leaving(value)
                    raise value
                return value
            if tag == TASK:
                checkpoint, validation = message
                send_to(part.pool.link, _answer(part.pool.link, payload, config, checkpoint,
                                                validation), 0, OUTCOME)
            # CANCEL of a validation that had already ended: nothing to stop.
    finally:
        if isinstance(payload, str):
            child.remove_payload(payload, config)


def _leaving(error: BaseException) -> None:
    """The training ranks stopped (status 75) and leave without MPI_Finalize, and so does this
    rank: tell mpiexec first, or it kills whichever rank is still on its way out (status 9)."""
    if getattr(error, "exit_status", None) is not None:
        finalize_with_hydra()


def _answer(link: Comm, payload: str | OSError, config: ValidationConfig,
            checkpoint: Checkpoint, validation: Validation) -> Validation | None:
    """The outcome for rank 0, whatever happens here: rank 0 waits for one."""
    try:
        if isinstance(payload, OSError):
            raise payload
        return _validate(link, payload, config, checkpoint, validation)
    except Exception as exc:  # noqa: BLE001  (an error here is this validation's outcome)
        return validation.ended(FAILED, error=f"on validation rank {link.rank}: "
                                f"{type(exc).__name__}: {exc}")


def _validate(link: Comm, payload: str, config: ValidationConfig, checkpoint: Checkpoint,
              validation: Validation) -> Validation | None:
    """Validate in a process on this node; None when rank 0 cancels it."""
    local = child.Local(payload, checkpoint, validation, config)
    try:
        deadline = None if validation.timeout_s is None else \
            time.monotonic() + validation.timeout_s
        while local.running:
            if link.iprobe(source=0, tag=CANCEL):
                receive_from(link, 0, CANCEL)
                return None
            if deadline is not None and time.monotonic() > deadline:
                return child.timed_out(local.process, validation)
            time.sleep(POLL_S)
        return local.outcome()
    finally:
        local.close()
