"""TrainContext: what a rank knows about itself and its run, from ``hpckit.get_context()``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hpckit.run.mpi.group import Topology
from hpckit.storage.location import Location

__all__ = ["TrainContext"]


@dataclass(frozen=True)
class TrainContext:
    """This rank's place in the job and where the experiment is stored.

    hpckit builds one for each rank as it starts the training function; a program gets it
    from ``hpckit.get_context()`` and reads it through the ``get_*`` methods, as in Ray.

    Args:
        topology: This rank's world and local rank and size, node rank and hostname.
        experiment_name: The experiment's name (``RunConfig(name)``).
        experiment: The experiment's directory on its storage.
        attempt: 0 for the first attempt, then one more for each restart after a failure.
        launcher: The launcher that started this process: ``mpiexec``, ``srun``, ``hpckit``
            (ranks hpckit started itself), or None (none: ``python train.py``).
        slurm: The Slurm job's variables that :meth:`get_slurm_info` returns; empty outside
            Slurm.
        artifact_dir: Returns this rank's artifact directory (:meth:`get_artifact_dir`).
        stop_requested: Returns whether the ranks agreed to stop (:meth:`should_stop`).
        checkpoint_dir: Returns the directory to write the next checkpoint into, in place
            (:meth:`get_checkpoint_dir`).
        checkpoint_due: Returns whether to checkpoint at the next report
            (:meth:`should_checkpoint`).
    """

    topology: Topology
    experiment_name: str
    experiment: Location
    attempt: int = 0
    launcher: str | None = None
    slurm: dict[str, str] = field(default_factory=dict)
    artifact_dir: Callable[[], str] = field(default=lambda: "", repr=False)
    stop_requested: Callable[[], bool] = field(default=lambda: False, repr=False)
    checkpoint_dir: Callable[[], str] = field(default=lambda: "", repr=False)
    checkpoint_due: Callable[[], bool] = field(default=lambda: True, repr=False)

    def get_world_rank(self) -> int:
        return self.topology.world_rank

    def get_world_size(self) -> int:
        return self.topology.world_size

    def get_local_rank(self) -> int:
        return self.topology.local_rank

    def get_local_world_size(self) -> int:
        return self.topology.local_size

    def get_node_rank(self) -> int:
        return self.topology.node_rank

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_experiment_path(self) -> str:
        """The experiment directory as a path on :meth:`get_storage_filesystem` (as in Ray:
        no scheme; ``bucket/prefix/name`` on S3)."""
        return self.experiment.path

    def get_storage_path(self) -> str:
        """The storage root that holds the experiment directory, on the same filesystem."""
        return self.experiment.parent.path

    def get_storage_filesystem(self) -> object:
        """The pyarrow filesystem the experiment is stored on."""
        return self.experiment.filesystem

    def get_attempt(self) -> int:
        """0 for the first attempt, then one more for each restart after a failure."""
        return self.attempt

    def get_slurm_info(self) -> dict[str, str]:
        """The Slurm job this rank runs in: job_id, array_job_id, array_task_id,
        restart_count, nodelist, tasks_per_node (those Slurm set; empty outside Slurm)."""
        return dict(self.slurm)

    def get_artifact_dir(self) -> str:
        """A local directory for this rank's artifacts (plots, samples, logs). With
        ``SyncConfig(sync_artifacts=True)`` its files are persisted to
        ``{experiment}/artifacts/rank-N/`` at every report; it is removed when the run ends."""
        return self.artifact_dir()

    def get_checkpoint_dir(self) -> str:
        """A local directory for this rank to write the next checkpoint into, in place: on
        POSIX storage it is the pending ``checkpoint_NNNNNN`` itself (the same for every rank,
        so give each rank's files their own names), on object storage a staging directory of
        this rank's. Hand it to ``report(checkpoint=Checkpoint.from_directory(...))``: its
        files are then committed without a copy (only hashed and synced; uploaded on object
        storage). Files written there belong to the next checkpoint reported."""
        return self.checkpoint_dir()

    def should_checkpoint(self) -> bool:
        """Whether to pass a checkpoint to the next ``report()``: True once Young/Daly's
        interval √(2·C·MTBF) has passed since the last committed checkpoint (C: what a
        checkpoint blocked, as measured; MTBF: ``CheckpointConfig(mtbf_s)``), before the first
        checkpoint, and when a stop was requested. Collective: every rank calls it the same
        number of times, and all get the same answer. (hpckit's own; Ray has no such call.)"""
        return self.checkpoint_due()

    def should_stop(self) -> bool:
        """True once the ranks agreed a stop was requested (e.g. Slurm's time-limit warning)."""
        return self.stop_requested()
