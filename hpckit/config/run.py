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
    """How often a failed run is started again, resuming from its last committed checkpoint.

    Args:
        max_failures: Restarts allowed after failures: an integer >= 0 (0, the default,
            never restarts), or -1 without limit. A lost node and an elastic shrink spend
            one each.
        max_preemption_failures: Requeues after the job was told to end (Slurm's time-limit
            warning, a preemption), counted apart from ``max_failures``: -1 (the default, as
            in Ray) requeues without limit, 0 never.
        hang_timeout_s: End a rank on which no ``report()`` completes within this many
            seconds (from the start of the training function, then from each report),
            leaving every thread's stack in ``{experiment}/logs/``; the attempt is recorded
            as ``hung`` and, where hpckit started the ranks, restarted as ``max_failures``
            allows. None (the default) never does: choose several times the longest gap
            between two reports, checkpoint included. hpckit's own (Ray's controller has
            no such watchdog).

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    max_failures: int = 0
    max_preemption_failures: int = -1
    hang_timeout_s: float | None = None

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
    """What else is copied where: each rank's artifacts, and a mirror of the experiment.

    hpckit's own meaning: Ray 2.60 deprecated its ``ray.train.SyncConfig``.

    Args:
        sync_artifacts: Persist rank 0's ``get_context().get_artifact_dir()`` to
            ``{experiment}/artifacts/rank-0/`` at every report (only files that changed).
            False by default.
        sync_artifacts_all_ranks: With ``sync_artifacts``, every rank's artifacts, each to
            its own ``rank-N/``. False by default.
        mirror: A second storage root (a path or URI) that receives a copy of the
            experiment: manifest, metrics and kept checkpoints. For scratch filesystems that
            are purged. None (the default): no mirror.
        mirror_command: Copy with this command instead of pyarrow, e.g.
            ``"rclone copy {source} {target}"`` (both placeholders required); ``{source}`` is
            the experiment directory, ``{target}`` the mirror's ``{mirror}/{name}``. A
            function ``(source, target)`` is called instead (Ray Tune's syncer). Needs
            ``mirror``; None (the default) copies with pyarrow.
        sync_period: Mirror at most once per this many seconds (>= 0, default 300) after a
            commit, and once at the end.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    sync_artifacts: bool = False
    sync_artifacts_all_ranks: bool = False
    mirror: str | None = None
    mirror_command: str | Callable[[str, str], Any] | None = None
    sync_period: float = 300.0

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
    where set, wins over ``log_level``.

    Args:
        log_level: Rank 0's level, a name of Python's logging levels in any case
            (``"DEBUG"``, ``"INFO"``, the default, ``"WARNING"``, ...).
        encoding: ``"TEXT"`` (the default) or ``"JSON"``, in any case; JSON is hpckit's own.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

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
    """Where the experiment lives and how it is checkpointed and retried.

    Args:
        name: The experiment's directory under ``storage_path``: one directory name (no
            ``/``, ``\\``, ``.`` or ``..``). None (the default): the script's name and the
            Slurm job id (so a requeued job resumes), or a timestamp.
        storage_path: A path, ``file://``, ``s3://`` or any pyarrow URI; with
            ``storage_filesystem``, a path inside it with no scheme. None (the default):
            ``$HPCKIT_STORAGE``, else ``~/hpckit_results``.
        storage_filesystem: A pyarrow filesystem to store into (wrap an fsspec one with
            ``PyFileSystem(FSSpecHandler(fs))``); None (the default) finds it from
            ``storage_path``.
        checkpoint_config: Retention of committed checkpoints; the default keeps all.
        failure_config: Restarts after failures; the default never restarts.
        sync_config: Artifacts and mirrors (hpckit's ``SyncConfig``); the default copies
            neither.
        logging_config: hpckit's log level and encoding; None (the default): INFO on rank
            0, text.
        callbacks: :class:`UserCallback` instances, called on rank 0 after each report and
            on failure (Ray calls them on its controller). None (the default): none.
        stop: When the run ends early, as Ray Tune's ``RunConfig(stop=...)``: a dict of
            metric thresholds (the run ends after the first report in which any metric
            reaches its value; ``training_iteration`` counts reports), or
            ``fn(name, metrics) -> bool``. Decided on rank 0's metrics and agreed by every
            rank; the report's checkpoint is committed first. None (the default) never
            stops early.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    name: str | None = None
    storage_path: str | os.PathLike[str] | None = None
    storage_filesystem: pyarrow.fs.FileSystem | None = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    sync_config: SyncConfig = field(default_factory=SyncConfig)
    logging_config: LoggingConfig | None = None
    callbacks: list[UserCallback] | None = None
    stop: dict[str, float] | Callable[[str, dict[str, Any]], bool] | None = None

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
