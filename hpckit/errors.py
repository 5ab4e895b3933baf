"""The hpckit exception hierarchy: every error hpckit raises is a :class:`HpckitError`."""

from __future__ import annotations

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
]


class HpckitError(Exception):
    """Base class of every error raised by hpckit."""


class ConfigError(HpckitError, ValueError):
    """A configuration value is invalid; the message names it and what is accepted."""


class StorageError(HpckitError, OSError):
    """Storage could not be read or written; the message names the location."""


class ManifestError(HpckitError):
    """An experiment's manifest is unreadable, invalid or from a newer hpckit."""


class MetricsError(HpckitError, TypeError):
    """Reported metrics cannot be stored as JSON; the message names the key."""


class CheckpointError(HpckitError):
    """A checkpoint directory is missing, malformed or clashes with another rank's."""


class CommitError(HpckitError):
    """A report's checkpoint could not be committed; raised identically on every rank."""


class ReportMismatchError(CommitError):
    """Ranks disagree on how many times they called ``report()``."""


class LaunchError(HpckitError):
    """Ranks could not be started, or the launched world disagrees with the config."""


class TrainingFailedError(HpckitError):
    """Training failed (after any retries); the message names the failed ranks."""


class ExperimentLockedError(HpckitError):
    """Another live run holds the experiment: two writers would corrupt its history."""
