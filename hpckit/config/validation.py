"""Validation of reported checkpoints apart from the training ranks, as in Ray Train 2.60:
``ValidationConfig`` on the trainer, ``report(..., validation=True | ValidationTaskConfig)``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from hpckit.errors import ConfigError


class ValidationFn(Protocol):
    """``fn(checkpoint, **fn_kwargs) -> dict`` of metrics, merged into the checkpoint's."""

    def __call__(self, checkpoint: Any, **kwargs: Any) -> dict[str, Any]:
        """Validate one committed checkpoint.

        Args:
            checkpoint: The committed ``Checkpoint`` to validate.
            **kwargs: The ``fn_kwargs`` of the trainer's ``ValidationConfig.task_config``,
                with those of the report's ``ValidationTaskConfig`` merged over them.

        Returns:
            Metrics (JSON values), merged over the checkpoint's reported ones.
        """
        ...


@dataclass(frozen=True)
class ValidationTaskConfig:
    """One validation's arguments: ``fn_kwargs`` (JSON values: the manifest keeps them, so a
    resumed run validates with the same) and ``timeout_s`` (None: no limit).

    Args:
        fn_kwargs: Keyword arguments for ``ValidationConfig.fn``, a dict of JSON values
            (Ray allows any object); None (the default) is ``{}``.
        timeout_s: The most seconds one validation may take (> 0), after which its status is
            ``VALIDATION_TIMEOUT``; None (the default): no limit.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    fn_kwargs: dict[str, Any] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        kwargs = {} if self.fn_kwargs is None else self.fn_kwargs
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}) must be a "
                              "dict of keyword arguments.")
        try:
            json.dumps(kwargs, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"ValidationTaskConfig(fn_kwargs=...) must hold JSON values, as "
                              f"in Ray ({exc}); pass paths or numbers, not objects.") from None
        object.__setattr__(self, "fn_kwargs", dict(kwargs))
        t = self.timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                              or not math.isfinite(t) or t <= 0):
            raise ConfigError(f"ValidationTaskConfig(timeout_s={t!r}) must be a number of "
                              "seconds > 0, or None for no limit.")


@dataclass(frozen=True)
class ValidationConfig:
    """How the trainer validates the checkpoints reported with ``validation=``: ``fn`` (a
    module-level function: it runs in a process of its own, which imports the script as the
    ranks do), the default ``task_config``, and ``ray_remote_kwargs``, of which hpckit uses
    ``num_cpus`` (the validation process's threads; default 1, so that training keeps its
    cores) and ignores the rest.

    Where the process runs (hpckit's, beside Ray's names): on rank 0's node by default; with
    ``ranks=N`` on the last N launched ranks, set aside from training (launch
    ``num_workers + N`` ranks), each validating one checkpoint at a time on its own node; with
    ``sbatch={"partition": "cpu", ...}`` each validation is a Slurm job of its own, submitted
    with these ``sbatch`` options (e.g. on cheaper nodes), which needs a POSIX storage_path
    that the job's node sees.

    Args:
        fn: ``fn(checkpoint, **fn_kwargs) -> dict`` of metrics, defined at module level (the
            validation process imports the script to find it).
        task_config: The default ``fn_kwargs`` and ``timeout_s`` of every validation; a
            report's ``ValidationTaskConfig`` is merged over it. None is the default
            ``ValidationTaskConfig()``.
        ray_remote_kwargs: Ray's task options; hpckit reads ``num_cpus`` only (a whole number
            >= 1, default 1: the validation process's threads) and ignores the rest.
        ranks: How many of the launched ranks validate instead of training (>= 0); 0 (the
            default) validates in a process on rank 0's node. hpckit's own.
        sbatch: sbatch long options (``{"partition": "cpu", "time": "30"}``, with or without
            the leading ``--``) that make each validation a Slurm job of its own; hpckit sets
            ``wait``, ``wrap``, ``parsable``, ``output``, ``error`` and ``cpus-per-task``
            itself. Not with ``ranks``. None (the default): no Slurm job. hpckit's own.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    fn: ValidationFn
    task_config: ValidationTaskConfig = field(default_factory=ValidationTaskConfig)
    ray_remote_kwargs: dict[str, Any] | None = None
    ranks: int = 0
    sbatch: dict[str, str | int] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"ValidationConfig(fn={self.fn!r}) must be a function "
                              "fn(checkpoint, **fn_kwargs) returning a dict of metrics.")
        if self.task_config is None:
            object.__setattr__(self, "task_config", ValidationTaskConfig())
        if not isinstance(self.task_config, ValidationTaskConfig):
            raise ConfigError(f"ValidationConfig(task_config={self.task_config!r}) must be a "
                              "ValidationTaskConfig.")
        remote = self.ray_remote_kwargs or {}
        cpus = remote.get("num_cpus", 1)
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus < 1:
            raise ConfigError(f"ValidationConfig(ray_remote_kwargs={{'num_cpus': {cpus!r}}}): "
                              "give a whole number of CPUs >= 1 for the validation process.")
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 0:
            raise ConfigError(f"ValidationConfig(ranks={self.ranks!r}) must be how many of the "
                              "launched ranks validate instead of training: a whole number "
                              ">= 0 (0: a process on rank 0's node).")
        if self.sbatch is not None:
            if self.ranks:
                raise ConfigError("ValidationConfig(ranks=..., sbatch=...): validate on ranks "
                                  "set aside or in Slurm jobs of their own, not both.")
            object.__setattr__(self, "sbatch", _sbatch_options(self.sbatch))

    @property
    def threads(self) -> int:
        return int((self.ray_remote_kwargs or {}).get("num_cpus", 1))

    def task(self, validation: bool | ValidationTaskConfig) -> dict[str, Any] | None:
        """What one report's ``validation=`` asks for, merged over the defaults (the report's
        ``fn_kwargs`` win, and its ``timeout_s``); None for no validation.

        Args:
            validation: What ``report(validation=...)`` was given: True (this config's
                ``task_config``), False, or a ``ValidationTaskConfig``.

        Raises:
            ConfigError: ``validation`` is none of these.
        """
        if validation is False:
            return None
        if validation is True:
            chosen = self.task_config
            kwargs = dict(chosen.fn_kwargs or {})
        elif isinstance(validation, ValidationTaskConfig):
            chosen = validation
            kwargs = {**(self.task_config.fn_kwargs or {}), **(validation.fn_kwargs or {})}
        else:
            raise ConfigError(f"report(validation={validation!r}) must be True, False or a "
                              "ValidationTaskConfig.")
        return {"fn_kwargs": kwargs, "timeout_s": chosen.timeout_s}


# What hpckit itself gives each validation job: it waits for the job and reads its answer.
SBATCH_OWN = frozenset({"wait", "wrap", "parsable", "output", "error", "cpus-per-task"})


def _sbatch_options(options: Any) -> dict[str, str]:
    """``{"partition": "cpu", "--mem": "8G"}`` as ``{"partition": "cpu", "mem": "8G"}``."""
    if not isinstance(options, dict):
        raise ConfigError(f"ValidationConfig(sbatch={options!r}) must be a dict of sbatch "
                          'options, e.g. {"partition": "cpu", "time": "30"}.')
    normal = {}
    for key, value in options.items():
        name = key.lstrip("-") if isinstance(key, str) else ""
        if not name or isinstance(value, bool) or not isinstance(value, (str, int)) or \
                "\n" in str(value):
            raise ConfigError(f"ValidationConfig(sbatch={{{key!r}: {value!r}}}): give sbatch "
                              'long options and their values, e.g. {"partition": "cpu"}.')
        if name in SBATCH_OWN:
            raise ConfigError(f"ValidationConfig(sbatch={{{key!r}: ...}}): hpckit sets --{name} "
                              "itself (num_cpus in ray_remote_kwargs gives --cpus-per-task); "
                              "leave it out.")
        normal[name] = str(value)
    return normal
