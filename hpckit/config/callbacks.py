"""UserCallback: code of the user's that hpckit calls on rank 0 as the run goes (Ray's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class TrainRunContext:
    """What a callback knows of the run (Ray's name): its configs and where it is stored.

    hpckit builds it and passes it to each :class:`UserCallback` call.

    Args:
        run_config: The run's ``RunConfig``.
        train_loop_config: The trainer's ``train_loop_config``; empty by default.
        scaling_config: The run's ``ScalingConfig``, or None where it has none.
        experiment_path: The experiment's directory, credentials redacted.
    """

    run_config: Any
    train_loop_config: dict[str, Any] = field(default_factory=dict)
    scaling_config: Any = None
    experiment_path: str = ""

    def get_run_config(self) -> Any:
        return self.run_config

    def get_train_loop_config(self) -> dict[str, Any]:
        return self.train_loop_config

    def get_scaling_config(self) -> Any:
        return self.scaling_config


class UserCallback:
    """Subclass it and pass instances in ``RunConfig(callbacks=[...])``. hpckit calls them
    on rank 0 (Ray calls them on its controller, which hpckit does not have), in report order:

    - ``after_report(run_context, metrics, checkpoint)`` once a report is recorded:
      ``metrics[i]`` is what rank i reported, ``checkpoint`` the committed checkpoint (None
      for a report without one; an asynchronous one is passed when it is committed);
    - ``after_exception(run_context, worker_exceptions)`` when the training function fails
      on every rank alike, or on rank 0 (a rank that fails alone ends the job at once).

    An exception in a callback fails the run, as a bug in the training function would.
    """

    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]],
                     checkpoint: Any) -> None:
        """Called after every rank has reported and the report is recorded.

        Args:
            run_context: The run's configs and where it is stored.
            metrics: What each rank reported: ``metrics[i]`` is rank i's, as stored (JSON
                values).
            checkpoint: The committed ``Checkpoint``, or None for a report without one (an
                asynchronous one is passed when it is committed).
        """

    def after_exception(self, run_context: TrainRunContext,
                        worker_exceptions: dict[int, BaseException]) -> None:
        """Called after the training function raised, with each failed rank's exception.

        Args:
            run_context: The run's configs and where it is stored.
            worker_exceptions: Each failed world rank mapped to its exception.
        """


@dataclass(frozen=True)
class TrackedExperiment:
    """What a tracker is told of the experiment whose run it keeps."""

    name: str  # the experiment's name: the tracker run's name
    path: str  # where it is stored (credentials redacted)
    config: dict[str, Any] = field(default_factory=dict)  # train_loop_config: the run's params
    trial_id: str | None = None  # in a sweep, the trial this experiment is
    group: str | None = None  # in a sweep, the sweep's name


class TrackerRun(Protocol):
    """One experiment's run in a tracker, as a :class:`TrackerCallback` opens it."""

    run_id: str
    next_step: int  # the first step the run lacks: what a restore reports again below it, it has

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Rank 0's metrics of the report at ``step`` (each step once)."""

    def end(self, status: str) -> None:
        """The experiment ended (``"FINISHED"``, ``"FAILED"``, ``"KILLED"``), for now: a
        resume opens the same run again."""


class TrackerCallback(UserCallback):
    """A callback that keeps the experiment as one run of an experiment tracker (MLflow,
    Weights & Biases): rank 0's experiment writer opens the run once the attempt's first
    report is committed (so that opening it never competes with the start of training), the
    run recorded in the manifest when the experiment opens again (a restart, a requeue, ``hpckit
    resume``), hands it every report's metrics off the training loop (a step reported again
    after a restore is not sent twice), and ends it as the attempt ends. Subclasses say how."""

    tracker = ""  # the tracker's name, under which the manifest records its run

    def open_run(self, run_id: str | None, experiment: TrackedExperiment) -> TrackerRun:
        """The tracker run of ``experiment``: ``run_id``'s again, or a new one where None (or
        where the tracker no longer has ``run_id``: it was deleted). Called on the
        experiment's trackers' thread, off the training loop.

        Args:
            run_id: The run the manifest records for this experiment, or None for a new
                one.
            experiment: The experiment's name, path, config and, in a sweep, its trial and
                sweep.

        Returns:
            The open run, which is then handed every report's metrics and ended.
        """
        raise NotImplementedError

    def new_run_id(self) -> str | None:
        """The id a new run will have, where the tracker lets the caller choose it (then the
        manifest records it before the run is opened); None where the tracker assigns it."""
        return None
