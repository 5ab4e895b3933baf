"""Configuration objects. Names and fields follow Ray Train's, so porting means changing imports."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow.fs

from hpckit.errors import ConfigError

__all__ = ["ScalingConfig", "CheckpointConfig", "CheckpointUploadMode", "FailureConfig",
           "SyncConfig", "RunConfig"]

_RESOURCE_KEYS = ("CPU", "GPU")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ScalingConfig:
    """How many ranks to run and what each one uses."""

    num_workers: int = 1
    """Number of ranks (world size). Under ``mpirun``/``srun`` it must equal the launched
    world; with ``python train.py`` hpckit starts this many ranks on this node."""

    use_gpu: bool = False
    """Train on CUDA devices with NCCL; otherwise on CPUs with Gloo."""

    resources_per_worker: dict[str, float] | None = None
    """``{"GPU": n, "CPU": m}``: GPUs per rank (may be fractional to share a device) and
    CPU threads per rank (sets ``torch.set_num_threads``)."""

    def __post_init__(self) -> None:
        if not _is_int(self.num_workers) or self.num_workers < 1:
            raise ConfigError(
                f"ScalingConfig(num_workers={self.num_workers!r}) is invalid: "
                "num_workers must be an integer >= 1 (the number of ranks).")
        if not isinstance(self.use_gpu, bool):
            raise ConfigError(f"ScalingConfig(use_gpu={self.use_gpu!r}) must be True or False.")
        resources = self.resources_per_worker
        if resources is None:
            return
        if not isinstance(resources, dict):
            raise ConfigError(
                f"ScalingConfig(resources_per_worker={resources!r}) must be a dict such as "
                '{"GPU": 1, "CPU": 4}.')
        for key, value in resources.items():
            if key not in _RESOURCE_KEYS:
                raise ConfigError(
                    f"ScalingConfig(resources_per_worker) has unknown resource {key!r}; "
                    f"accepted: {', '.join(_RESOURCE_KEYS)}.")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(
                    f"ScalingConfig(resources_per_worker[{key!r}]={value!r}) must be a number > 0.")
        if resources.get("GPU") and not self.use_gpu:
            raise ConfigError(
                f"ScalingConfig(resources_per_worker={resources!r}) asks for GPUs but use_gpu=False; "
                "set use_gpu=True or drop the GPU entry.")
        if "CPU" in resources and not float(resources["CPU"]).is_integer():
            raise ConfigError(
                f"ScalingConfig(resources_per_worker['CPU']={resources['CPU']!r}) must be a whole "
                "number of CPU threads.")

    @property
    def gpus_per_worker(self) -> float:
        if not self.use_gpu:
            return 0.0
        return float((self.resources_per_worker or {}).get("GPU", 1))

    @property
    def cpus_per_worker(self) -> int | None:
        cpus = (self.resources_per_worker or {}).get("CPU")
        return None if cpus is None else int(cpus)


class CheckpointUploadMode(enum.Enum):
    """How ``report()`` persists a checkpoint, as ``ray.train.CheckpointUploadMode``.

    ``SYNC``: ``report()`` returns once the checkpoint is committed. ``ASYNC``: it returns once
    the files are handed over; they are persisted in the background and committed at a later
    collective point. ``NO_UPLOAD``: the files are already in the pending checkpoint
    (``get_context().get_checkpoint_dir()``); they are only hashed, synced and committed.
    """

    ASYNC = "ASYNC"
    SYNC = "SYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Ray's default: the handed directory is hpckit's to remove only in ``ASYNC`` mode."""
        return self is CheckpointUploadMode.ASYNC

    @classmethod
    def parse(cls, value: Any) -> CheckpointUploadMode:
        """The mode for ``value``: a member, or its name in any case (``"async"``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise ConfigError(
            f"report(checkpoint_upload_mode={value!r}) is invalid: use "
            "hpckit.CheckpointUploadMode.SYNC, ASYNC or NO_UPLOAD (or 'sync', 'async', "
            "'no_upload').")


@dataclass(frozen=True)
class CheckpointConfig:
    """Which committed checkpoints to keep. The latest one is always kept: a resume needs it."""

    num_to_keep: int | None = None
    """Keep this many checkpoints (the best, or the most recent without a score); None keeps all."""

    checkpoint_score_attribute: str | None = None
    """Metric that ranks checkpoints; a missing or NaN score ranks worst. None ranks by recency."""

    checkpoint_score_order: Literal["max", "min"] = "max"
    """Whether a higher (``"max"``) or lower (``"min"``) score is better."""

    verify_on_resume: bool = True
    """Before resuming, read the newest checkpoint back and check every file's size and SHA-256
    against the manifest; a damaged one is skipped (loudly) for the newest that verifies."""

    max_checkpoints_in_flight: int = 1
    """Asynchronous checkpoints persisted in the background and not yet committed, at most;
    when as many are in flight, the next ``report()`` with a checkpoint waits for the oldest."""

    def __post_init__(self) -> None:
        in_flight = self.max_checkpoints_in_flight
        if not _is_int(in_flight) or in_flight < 1:
            raise ConfigError(
                f"CheckpointConfig(max_checkpoints_in_flight={in_flight!r}) is invalid: use an "
                "integer >= 1 (1 overlaps one checkpoint with training; more use more disk).")
        if not isinstance(self.verify_on_resume, bool):
            raise ConfigError(
                f"CheckpointConfig(verify_on_resume={self.verify_on_resume!r}) must be True or False.")
        if self.num_to_keep is not None and (not _is_int(self.num_to_keep) or self.num_to_keep < 1):
            raise ConfigError(
                f"CheckpointConfig(num_to_keep={self.num_to_keep!r}) is invalid: use an integer "
                ">= 1, or None to keep every checkpoint.")
        attribute = self.checkpoint_score_attribute
        if attribute is not None and (not isinstance(attribute, str) or not attribute):
            raise ConfigError(
                f"CheckpointConfig(checkpoint_score_attribute={attribute!r}) must be the name of a "
                "reported metric (a non-empty string), or None to rank by recency.")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ConfigError(
                f"CheckpointConfig(checkpoint_score_order={self.checkpoint_score_order!r}) is "
                "invalid: use 'max' (higher is better) or 'min' (lower is better).")


@dataclass(frozen=True)
class FailureConfig:
    """How often a failed run is started again, resuming from its last committed checkpoint."""

    max_failures: int = 0
    """Restarts allowed after failures; 0 never restarts, -1 restarts without limit."""

    def __post_init__(self) -> None:
        if not _is_int(self.max_failures) or self.max_failures < -1:
            raise ConfigError(
                f"FailureConfig(max_failures={self.max_failures!r}) is invalid: use an integer "
                ">= 0, or -1 for unlimited restarts.")


@dataclass(frozen=True)
class SyncConfig:
    """What else is copied where: each rank's artifacts, and a mirror of the experiment."""

    sync_artifacts: bool = False
    """Persist rank 0's ``get_context().get_artifact_dir()`` to ``{experiment}/artifacts/rank-0/``
    at every report (only files that changed)."""

    sync_artifacts_all_ranks: bool = False
    """With ``sync_artifacts``, every rank's artifacts, each to its own ``rank-N/``."""

    mirror: str | None = None
    """A second storage root (a path or URI) that receives a copy of the experiment: manifest,
    metrics and kept checkpoints. For scratch filesystems that are purged."""

    mirror_command: str | None = None
    """Copy with this command instead of pyarrow, e.g. ``"rclone copy {source} {target}"``;
    ``{source}`` is the experiment directory, ``{target}`` the mirror's ``{mirror}/{name}``."""

    sync_period: float = 300.0
    """Mirror at most once per this many seconds (after a commit), and once at the end."""

    def __post_init__(self) -> None:
        for name in ("sync_artifacts", "sync_artifacts_all_ranks"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"SyncConfig({name}={getattr(self, name)!r}) must be True or False.")
        if self.mirror is not None and (not isinstance(self.mirror, str) or not self.mirror.strip()):
            raise ConfigError(f"SyncConfig(mirror={self.mirror!r}) must be a path or URI, e.g. "
                              "'/project/archive/runs' or 's3://bucket/runs'.")
        command = self.mirror_command
        if command is not None:
            if not isinstance(command, str) or "{source}" not in command or "{target}" not in command:
                raise ConfigError(f"SyncConfig(mirror_command={command!r}) must be a command with "
                                  "{source} and {target} in it, e.g. 'rclone copy {source} {target}'.")
            if self.mirror is None:
                raise ConfigError(f"SyncConfig(mirror_command={command!r}) needs mirror= too: it "
                                  "names the {target}.")
        period = self.sync_period
        if isinstance(period, bool) or not isinstance(period, (int, float)) or not period >= 0:
            raise ConfigError(f"SyncConfig(sync_period={period!r}) must be a number of seconds >= 0.")


@dataclass(frozen=True)
class RunConfig:
    """Where the experiment lives and how it is checkpointed and retried."""

    name: str | None = None
    """Experiment directory name under storage_path. Default: the script's name and the Slurm
    job id (so a requeued job resumes) or a timestamp."""

    storage_path: str | os.PathLike[str] | None = None
    """A path, ``file://``, ``s3://`` or any pyarrow URI; default ``$HPCKIT_STORAGE`` or
    ``~/hpckit_results``. With ``storage_filesystem``, a path inside it with no scheme."""

    storage_filesystem: pyarrow.fs.FileSystem | None = None
    """A pyarrow filesystem to store into (wrap fsspec ones with ``PyFileSystem(FSSpecHandler(fs))``)."""

    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Retention of committed checkpoints."""

    failure_config: FailureConfig = field(default_factory=FailureConfig)
    """Restarts after failures."""

    sync_config: SyncConfig = field(default_factory=SyncConfig)
    """Artifacts and mirrors."""

    def __post_init__(self) -> None:
        if self.name is not None:
            _check_name(self.name)
        path = self.storage_path
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ConfigError(
                f"RunConfig(storage_path={path!r}) must be a path or URI string.")
        if path is not None and not os.fspath(path).strip():
            raise ConfigError("RunConfig(storage_path='') is empty; give a directory or a URI.")
        fs = self.storage_filesystem
        if fs is not None:
            if not isinstance(fs, pyarrow.fs.FileSystem):
                raise ConfigError(
                    f"RunConfig(storage_filesystem={fs!r}) must be a pyarrow.fs.FileSystem; wrap an "
                    "fsspec filesystem with pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)).")
            if path is not None and "://" in os.fspath(path):
                raise ConfigError(
                    f"RunConfig(storage_path={os.fspath(path)!r}) has a scheme, but a "
                    "storage_filesystem is given: pass the path inside that filesystem, e.g. "
                    "'bucket/runs'.")
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise ConfigError(
                f"RunConfig(checkpoint_config={self.checkpoint_config!r}) must be a CheckpointConfig.")
        if not isinstance(self.failure_config, FailureConfig):
            raise ConfigError(
                f"RunConfig(failure_config={self.failure_config!r}) must be a FailureConfig.")
        if not isinstance(self.sync_config, SyncConfig):
            raise ConfigError(f"RunConfig(sync_config={self.sync_config!r}) must be a SyncConfig.")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"RunConfig(name={name!r}) must be a non-empty string.")
    if "/" in name or "\\" in name or name in (".", "..") or name.startswith(".."):
        raise ConfigError(
            f"RunConfig(name={name!r}) is invalid: the name is one directory under storage_path, "
            "so it may not contain '/' or '\\' or be '.'/'..'; use e.g. 'resnet-fmnist'.")
    if any(ord(c) < 32 for c in name):
        raise ConfigError(f"RunConfig(name={name!r}) contains control characters.")

