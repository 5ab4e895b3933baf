"""The training session of one rank, and the module-level API that reaches it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpckit._experiment import MetricsLog
from hpckit._manifest import Manifest
from hpckit.checkpoint import Checkpoint
from hpckit.config import CheckpointConfig
from hpckit.context import TrainContext
from hpckit.errors import HpckitError


@dataclass
class Session:
    """State that lives for one attempt of one rank. ``manifest`` and ``metrics`` are rank 0's."""

    comm: Any
    context: TrainContext
    checkpoint_config: CheckpointConfig
    next_step: int
    latest: Checkpoint | None
    seed: Checkpoint | None
    manifest: Manifest | None = None
    metrics: MetricsLog | None = None
    reports: int = 0
    last_metrics: dict[str, Any] | None = None
    mirror: Any = None

    def coordinator_state(self) -> tuple[Manifest, MetricsLog]:
        """The manifest and metrics log, which only rank 0 holds."""
        if self.manifest is None or self.metrics is None:
            raise RuntimeError(f"rank {self.comm.rank} asked for rank 0's manifest")
        return self.manifest, self.metrics


_current: Session | None = None


def activate(session: Session | None) -> None:
    global _current
    _current = session


def current(caller: str) -> Session:
    if _current is None:
        raise HpckitError(
            f"hpckit.{caller}() was called outside a training run; call it inside the training "
            "function passed to TorchTrainer(...) (or DataParallelTrainer), which fit() runs on every rank.")
    return _current


def get_context() -> TrainContext:
    """This rank's :class:`TrainContext`: ranks, topology, experiment, stop requests."""
    return current("get_context").context


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint (on resume), else ``resume_from_checkpoint``, else None."""
    session = current("get_checkpoint")
    return session.latest or session.seed


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
    """Record rank 0's metrics and persist every rank's checkpoint files as one checkpoint.

    Collective: every rank calls it the same number of times. Returns once the checkpoint is
    committed in the manifest; raises the same error on every rank when it could not be.
    """
    from hpckit._commit import commit_report

    session = current("report")
    commit_report(session, metrics, checkpoint)
    session.context._artifacts.sync()
