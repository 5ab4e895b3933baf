"""The training session of one rank, and the module-level API that reaches it
(``hpckit.report``, ``hpckit.get_checkpoint``, ``hpckit.get_context``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpckit.checkpoint import Checkpoint
from hpckit.errors import HpckitError
from hpckit.experiment.artifacts import Artifacts
from hpckit.logs import log
from hpckit.run.commit import CommitProtocol
from hpckit.run.context import TrainContext
from hpckit.run.stop import StopRequested


@dataclass
class Session:
    """What lives for one attempt of one rank."""

    context: TrainContext
    protocol: CommitProtocol
    seed: Checkpoint | None
    artifacts: Artifacts
    stop_requested: str | None = None

    def report(self, metrics: Any, checkpoint: Checkpoint | None) -> None:
        outcome = self.protocol.report(metrics, checkpoint)
        self.artifacts.sync()
        if outcome.stop and not self.stop_requested:
            self.stop_requested = outcome.stop
            if self.context.get_world_rank() == 0:
                log.warning("stop requested (%s): the run stops after its next committed "
                            "checkpoint", outcome.stop)
        if self.stop_requested and outcome.committed is not None:
            raise StopRequested(self.stop_requested)


_current: Session | None = None


def activate(session: Session | None) -> None:
    global _current
    _current = session


def current(caller: str) -> Session:
    if _current is None:
        raise HpckitError(
            f"hpckit.{caller}() was called outside a training run; call it inside the training "
            "function passed to TorchTrainer(...) (or DataParallelTrainer), which fit() runs on "
            "every rank.")
    return _current


def get_context() -> TrainContext:
    """This rank's :class:`TrainContext`: ranks, topology, experiment, stop requests."""
    return current("get_context").context


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint (on resume), else ``resume_from_checkpoint``, else None."""
    session = current("get_checkpoint")
    return session.protocol.latest or session.seed


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
    """Record rank 0's metrics and persist every rank's checkpoint files as one checkpoint.

    Collective: every rank calls it the same number of times. Returns once the checkpoint is
    committed in the manifest; raises the same error on every rank when it could not be.
    """
    current("report").report(metrics, checkpoint)
