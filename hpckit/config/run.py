"""RunConfig and what it holds: where the experiment lives, restarts, mirrors, logging."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs

from hpckit.config.callbacks import UserCallback
from hpckit.config.checkpointing import CheckpointConfig
from hpckit.config.values import is_int
from hpckit.errors import ConfigError


@dataclass(frozen=True)
class FailureConfig:
    """How often a failed run is started again, resuming from its last committed checkpoint."""

    max_failures: int = 0
    """Restarts allowed after failures; 0 never restarts, -1 restarts without limit."""

    max_preemption_failures: int = -1
    """Requeues after the job was told to end (Slurm's time-limit warning, a preemption),
    counted apart from ``max_failures``; -1 (as in Ray) requeues without limit, 0 never."""

    hang_timeout_s: float | None = None
    """End a rank on which no ``report()`` completes within this many seconds (from the
    start of the training function, then from each report), leaving every thread's stack in
    ``{experiment}/logs/``; the attempt is recorded as ``hung`` and, where hpckit started
    the ranks, restarted as ``max_failures`` allows. None (the default) never does: choose
    several times the longest gap between two reports, checkpoint included."""

    def __post_init__(self) -> None:
        for name in ("max_failures", "max_preemption_failures"):
            value = getattr(self, name)
            if not is_int(value) or value < -1:
                raise ConfigError(f"FailureConfig({name}={value!r}) is invalid: use an integer "
                                  ">= 0, or -1 for no limit.")
        timeout = self.hang_timeout_s
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or not timeout > 0):
            raise ConfigError(f"FailureConfig(hang_timeout_s={timeout!r}) is invalid: use a "
                              "number of seconds > 0 (several times the longest gap between "
                              "two reports), or None to never end a hung rank.")


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

    mirror_command: str | Callable[[str, str], Any] | None = None
    """Copy with this command instead of pyarrow, e.g. ``"rclone copy {source} {target}"``;
    ``{source}`` is the experiment directory, ``{target}`` the mirror's ``{mirror}/{name}``.
    A function ``(source, target)`` is called instead (Ray Tune's syncer)."""

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
            if not callable(command) and (not isinstance(command, str) or "{source}" not in command
                                          or "{target}" not in command):
                raise ConfigError(f"SyncConfig(mirror_command={command!r}) must be a command with "
                                  "{source} and {target} in it, e.g. 'rclone copy {source} "
                                  "{target}', or a function (source, target).")
            if self.mirror is None:
                raise ConfigError(f"SyncConfig(mirror_command={command!r}) needs mirror= too: it "
                                  "names the {target}.")
        period = self.sync_period
        if isinstance(period, bool) or not isinstance(period, (int, float)) or not period >= 0:
            raise ConfigError(f"SyncConfig(sync_period={period!r}) must be a number of seconds >= 0.")


LOG_ENCODINGS = ("TEXT", "JSON")


@dataclass(frozen=True)
class LoggingConfig:
    """hpckit's own log lines (Ray's name). ``log_level`` is rank 0's level; the other ranks
    log warnings and errors (and debug lines too at "DEBUG"). ``encoding`` "JSON" writes one
    object per line (time, level, rank, message) for log collectors. ``HPCKIT_LOG_LEVEL``,
    where set, wins over ``log_level``."""

    log_level: str = "INFO"
    encoding: str = "TEXT"

    def __post_init__(self) -> None:
        names = [n for n in logging.getLevelNamesMapping() if n != "NOTSET"]
        if not isinstance(self.log_level, str) or self.log_level.upper() not in names:
            raise ConfigError(f"LoggingConfig(log_level={self.log_level!r}) must be one of "
                              f"{', '.join(sorted(names))}.")
        if not isinstance(self.encoding, str) or self.encoding.upper() not in LOG_ENCODINGS:
            raise ConfigError(f"LoggingConfig(encoding={self.encoding!r}) must be 'TEXT' or 'JSON'.")
        object.__setattr__(self, "log_level", self.log_level.upper())
        object.__setattr__(self, "encoding", self.encoding.upper())


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

    logging_config: LoggingConfig | None = None
    """hpckit's log level and encoding (default: INFO on rank 0, text)."""

    callbacks: list[UserCallback] | None = None
    """:class:`UserCallback` instances, called on rank 0 after each report and on failure."""

    stop: dict[str, float] | Callable[[str, dict[str, Any]], bool] | None = None
    """When the run ends early, as Ray Tune's ``RunConfig(stop=...)``: a dict of metric
    thresholds (the run ends after the first report in which any metric reaches its value;
    ``training_iteration`` counts reports), or ``fn(name, metrics) -> bool``. Decided on rank
    0's metrics and agreed by every rank; the report's checkpoint is committed first."""

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
        callbacks = self.callbacks
        if callbacks is not None and (not isinstance(callbacks, (list, tuple)) or not all(
                isinstance(c, UserCallback) for c in callbacks)):
            raise ConfigError(f"RunConfig(callbacks={callbacks!r}) must be a list of "
                              "hpckit.UserCallback instances (subclass it).")
        _check_stop(self.stop)
        if self.logging_config is not None and not isinstance(self.logging_config, LoggingConfig):
            raise ConfigError(
                f"RunConfig(logging_config={self.logging_config!r}) must be a LoggingConfig.")


def _check_stop(stop: object) -> None:
    if stop is None or callable(stop):
        return
    numbers = isinstance(stop, dict) and all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
        for k, v in stop.items())
    if not numbers or not stop:
        raise ConfigError(f"RunConfig(stop={stop!r}) must be a dict of metric names to "
                          "thresholds, e.g. {'training_iteration': 10, 'accuracy': 0.95}, or "
                          "a function (name, metrics) -> bool.")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"RunConfig(name={name!r}) must be a non-empty string.")
    if "/" in name or "\\" in name or name in (".", "..") or name.startswith(".."):
        raise ConfigError(
            f"RunConfig(name={name!r}) is invalid: the name is one directory under storage_path, "
            "so it may not contain '/' or '\\' or be '.'/'..'; use e.g. 'resnet-fmnist'.")
    if any(ord(c) < 32 for c in name):
        raise ConfigError(f"RunConfig(name={name!r}) contains control characters.")
