"""CheckpointConfig and CheckpointUploadMode: what is kept, and how a report hands its files over."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from hpckit.config.values import is_int
from hpckit.errors import ConfigError


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
        """The mode for ``value``: a member, or its name in any case (``"async"``).

        Args:
            value: A ``CheckpointUploadMode``, or ``"sync"``, ``"async"`` or
                ``"no_upload"`` in any case.

        Raises:
            ConfigError: ``value`` is none of these.
        """
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
    """Which committed checkpoints to keep. The latest one is always kept: a resume needs it.

    Args:
        num_to_keep: Keep this many checkpoints (the best, or the most recent without a
            score), an integer >= 1; None (the default) keeps all.
        checkpoint_score_attribute: The reported metric that ranks checkpoints; a missing or
            NaN score ranks worst in either order (Ray ranks a missing one best under
            ``"min"``). None (the default) ranks by recency.
        checkpoint_score_order: Whether a higher (``"max"``, the default) or lower
            (``"min"``) score is better.
        verify_on_resume: Before resuming, read the newest checkpoint back and check every
            file's size and checksum against the manifest; a damaged one is skipped (loudly)
            for the newest that verifies. True by default; hpckit's own.
        max_checkpoints_in_flight: Asynchronous checkpoints persisted in the background and
            not yet committed, at most (an integer >= 1, default 1); when as many are in
            flight, the next ``report()`` with a checkpoint waits for the oldest.
        mtbf_s: Mean time between failures of the job, in seconds (> 0), for
            ``get_context().should_checkpoint()`` (Young/Daly's interval √(2·C·MTBF)). One
            day by default; a job on many nodes fails more often: about a node's MTBF
            divided by the nodes.
        checkpoint_frequency: For a ``tune.Trainable`` class: checkpoint every this many
            iterations (an integer >= 0; 0, the default, never).
        checkpoint_at_end: For a ``tune.Trainable`` class: checkpoint after its last
            iteration too (True or False; None, the default, does not).
        cache_dir: An absolute path on a node-local disk (NVMe, ``$TMPDIR``, ``/dev/shm``)
            where checkpoints are written first; only every ``persist_every``-th goes to
            ``storage_path`` too. None (the default): every checkpoint goes to
            ``storage_path`` alone. hpckit's own; see docs/multilevel.md.
        persist_every: With ``cache_dir``: every Nth checkpoint also goes to
            ``storage_path`` (an integer >= 1, default 1: every one), and so do the last one
            of a run and the one taken at a stop signal.
        redundancy: With ``cache_dir``: ``"partner"`` copies each node's cached files to
            the next node over MPI before the checkpoint commits, so that a node whose disk
            is lost restarts from its partner's copy. None (the default): a cached
            checkpoint lives on its own node alone.
        exact_resume: Save every rank's random streams (Python, NumPy, torch, each CUDA
            device) and the positions of its loaders from ``prepare_data_loader`` with every
            checkpoint, and restore them at the first ``get_checkpoint()`` of a resumed run,
            so that it continues as the uninterrupted run would have (True, the default).
            False: a resumed run's loaders start their epoch afresh and its random streams
            are left as the script sets them. hpckit's own; see docs/resume.md.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    verify_on_resume: bool = True
    max_checkpoints_in_flight: int = 1
    mtbf_s: float = 86400.0
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None
    cache_dir: str | None = None
    persist_every: int = 1
    redundancy: Literal["partner"] | None = None
    exact_resume: bool = True

    def __post_init__(self) -> None:
        _check_levels(self)
        _check_class_checkpoints(self)
        mtbf = self.mtbf_s
        if isinstance(mtbf, bool) or not isinstance(mtbf, (int, float)) or not mtbf > 0:
            raise ConfigError(f"CheckpointConfig(mtbf_s={mtbf!r}) is invalid: use the job's mean "
                              "time between failures in seconds (> 0), e.g. 86400 for a day.")
        in_flight = self.max_checkpoints_in_flight
        if not is_int(in_flight) or in_flight < 1:
            raise ConfigError(
                f"CheckpointConfig(max_checkpoints_in_flight={in_flight!r}) is invalid: use an "
                "integer >= 1 (1 overlaps one checkpoint with training; more use more disk).")
        if not isinstance(self.exact_resume, bool):
            raise ConfigError(
                f"CheckpointConfig(exact_resume={self.exact_resume!r}) must be True or False.")
        if not isinstance(self.verify_on_resume, bool):
            raise ConfigError(
                f"CheckpointConfig(verify_on_resume={self.verify_on_resume!r}) must be True or False.")
        if self.num_to_keep is not None and (not is_int(self.num_to_keep) or self.num_to_keep < 1):
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


def _check_class_checkpoints(config: CheckpointConfig) -> None:
    frequency, at_end = config.checkpoint_frequency, config.checkpoint_at_end
    if not is_int(frequency) or frequency < 0:
        raise ConfigError(f"CheckpointConfig(checkpoint_frequency={frequency!r}) must be an "
                          "integer >= 0 (iterations of a tune.Trainable; 0 never).")
    if at_end is not None and not isinstance(at_end, bool):
        raise ConfigError(f"CheckpointConfig(checkpoint_at_end={at_end!r}) must be True, False "
                          "or None.")


def _check_levels(config: CheckpointConfig) -> None:
    cache, every, redundancy = config.cache_dir, config.persist_every, config.redundancy
    if cache is not None and (not isinstance(cache, str) or not cache.startswith("/")):
        raise ConfigError(
            f"CheckpointConfig(cache_dir={cache!r}) is invalid: use an absolute path on a "
            "node-local disk, e.g. '/dev/shm/ckpt' or os.environ['TMPDIR'] (storage_path is "
            "where checkpoints are shared; the cache is each node's own).")
    if not is_int(every) or every < 1:
        raise ConfigError(f"CheckpointConfig(persist_every={every!r}) is invalid: use an "
                          "integer >= 1 (1 sends every checkpoint to storage_path too).")
    if redundancy == "xor":
        raise ConfigError("CheckpointConfig(redundancy='xor') is not available: hpckit keeps a "
                          "full copy on a partner node; use redundancy='partner'.")
    if redundancy not in (None, "partner"):
        raise ConfigError(f"CheckpointConfig(redundancy={redundancy!r}) is invalid: use "
                          "'partner' (a copy on the next node) or None.")
    if cache is None and (every != 1 or redundancy is not None):
        raise ConfigError(
            f"CheckpointConfig(persist_every={every!r}, redundancy={redundancy!r}) needs a "
            "node-local cache_dir: without one every checkpoint goes to storage_path; set "
            "cache_dir='/dev/shm/ckpt' (or a local NVMe path), or drop them.")
