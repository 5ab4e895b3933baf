"""``tune.run`` and ``tune.SyncConfig(upload_dir, syncer)``: the form of Ray Tune's checkpoint
guide, as a thin layer over :class:`~hpckit.sweep.tuner.Tuner` (no second engine).

Each argument becomes its Tuner form (logged once, as Ray logs its deprecations); an argument
hpckit cannot honour (Ray's resources, reporters) is an error naming it, before any trial
starts; ``scheduler``, ``search_alg`` and ``time_budget_s`` go to the TuneConfig. The
guide's layout holds: ``{upload_dir or local_dir}/{name}/{trial}/``, each trial an ordinary
hpckit experiment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpckit import logs, settings
from hpckit.config import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig
from hpckit.config import SyncConfig as RunSyncConfig
from hpckit.errors import ConfigError
from hpckit.launch import mainimport
from hpckit.launch.trainer import DataParallelTrainer
from hpckit.logs import log
from hpckit.run.mpi.comm import world
from hpckit.sweep.analysis import ExperimentAnalysis
from hpckit.sweep.config import TuneConfig
from hpckit.sweep.guide import GuideFunction, takes_checkpoint_dir
from hpckit.sweep.trainable import ClassRunner, Trainable
from hpckit.sweep.tuner import Tuner

RESUME = ("AUTO", True, False, "ERRORED_ONLY")
AGGREGATES = ("avg", "mean", "last", "first", "sum", "median")


@dataclass(frozen=True)
class SyncConfig:
    """The guide's ``tune.SyncConfig``: ``upload_dir`` (where the experiment lives: S3 or any
    storage hpckit supports), ``syncer`` (``"auto"``, None for a shared directory with no
    copying, a command with ``{source}`` and ``{target}``, or a function ``(source,
    target)``), ``sync_period`` in seconds.

    Args:
        upload_dir: Where the sweep's experiment lives or is copied to: a path or URI, such
            as ``"s3://bucket/path/"``; None (the default): ``local_dir``'s only.
        syncer: ``"auto"`` (the default): the experiment lives at ``upload_dir`` itself;
            None: ``local_dir`` is shared and nothing is copied (not with ``upload_dir``);
            a command with ``{source}`` and ``{target}``, or a function ``(source, target)``:
            each trial lives in ``local_dir`` and is copied to
            ``{upload_dir}/{name}/{trial}`` by that command.
        sync_period: With a command or function, copy at most once per this many seconds
            (>= 0, default 300) after a commit, and once at a trial's end.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    upload_dir: str | None = None
    syncer: str | Callable[[str, str], Any] | None = "auto"
    sync_period: float = 300.0

    def __post_init__(self) -> None:
        syncer = self.syncer
        if isinstance(syncer, str) and syncer != "auto" and (
                "{source}" not in syncer or "{target}" not in syncer):
            raise ConfigError(f"tune.SyncConfig(syncer={syncer!r}) must be 'auto', None, a "
                              "function (source, target), or a command with {source} and "
                              "{target}, e.g. 'aws s3 sync {source} {target}'.")
        if syncer is not None and not isinstance(syncer, str) and not callable(syncer):
            raise ConfigError(f"tune.SyncConfig(syncer={syncer!r}) is not a command or function.")
        if self.upload_dir is not None and (not isinstance(self.upload_dir, str)
                                            or not self.upload_dir):
            raise ConfigError(f"tune.SyncConfig(upload_dir={self.upload_dir!r}) must be a path "
                              "or URI, e.g. 's3://bucket/path/'.")
        if self.upload_dir is not None and syncer is None:
            raise ConfigError("tune.SyncConfig(upload_dir=..., syncer=None) copies nothing to "
                              "upload_dir: drop syncer=None (the experiment then lives at "
                              "upload_dir), or drop upload_dir (a shared local_dir).")
        period = self.sync_period
        if isinstance(period, bool) or not isinstance(period, (int, float)) or period < 0:
            raise ConfigError(f"tune.SyncConfig(sync_period={period!r}) must be seconds >= 0.")


def score_attr(attr: Any) -> tuple[str, str]:
    """``"auc"``, ``"max-auc"``, ``"min-loss"`` as (attribute, order)."""
    if not isinstance(attr, str) or not attr.strip("-"):
        raise ConfigError(f"tune.run(checkpoint_score_attr={attr!r}) must name a metric: "
                          "'auc', 'max-auc' or 'min-loss'.")
    prefix, _, rest = attr.partition("-")
    if prefix in ("min", "max") and rest:
        return rest, prefix
    if prefix in AGGREGATES and rest:
        raise ConfigError(f"tune.run(checkpoint_score_attr={attr!r}): '{prefix}-' is not a form "
                          f"Ray knows; use 'max-{rest}' or 'min-{rest}'.")
    return attr, "max"


def run(run_or_experiment: Any, *, name: str | None = None, config: dict[str, Any] | None = None,
        num_samples: int = 1, stop: Any = None, metric: str | None = None,
        mode: str | None = None, local_dir: str | None = None, storage_path: str | None = None,
        sync_config: SyncConfig | None = None, checkpoint_score_attr: str | None = None,
        keep_checkpoints_num: int | None = None, checkpoint_freq: int = 0,
        checkpoint_at_end: bool = False, resume: str | bool = False, restore: Any = None,
        max_failures: int = 0, max_concurrent_trials: int | None = None, verbose: int = 2,
        scheduler: Any = None, search_alg: Any = None, time_budget_s: float | None = None,
        **others: Any) -> ExperimentAnalysis:
    """As ``ray.tune.run`` (Ray's older form): run every trial, return the analysis.

    A thin layer over :class:`Tuner`: each argument becomes its ``Tuner`` form, logged once
    (docs/sweeps.md has the table).

    Args:
        run_or_experiment: The trainable: a function ``fn(config)`` or the guide's
            ``fn(config, checkpoint_dir=None)``, a ``tune.Trainable`` class, or a
            ``DataParallelTrainer``/``TorchTrainer`` for trials of several ranks. A name
            (Ray's registry) is refused.
        name: The sweep's directory name; None (the default): the trainable's name.
        config: The search space (``param_space``); None (the default) is ``{}``.
        num_samples: ``TuneConfig(num_samples)``; default 1.
        stop: ``RunConfig(stop)``, per trial: a dict of thresholds, a function, or an
            integer (a number of ``training_iteration``s); None (the default) never stops
            early.
        metric: ``TuneConfig(metric)``; None (the default): none.
        mode: ``TuneConfig(mode)``, ``"max"`` or ``"min"``; None (the default): none.
        local_dir: The storage root, as ``RunConfig(storage_path)``; None (the default):
            ``storage_path``, else hpckit's default.
        storage_path: The storage root (the same as ``local_dir`` where both are given);
            None (the default): ``local_dir``.
        sync_config: A ``tune.SyncConfig`` (this module's, not hpckit's); None (the default)
            copies nothing.
        checkpoint_score_attr: The metric that ranks a trial's checkpoints: ``"auc"``,
            ``"max-auc"`` or ``"min-loss"``; None (the default) ranks by recency.
        keep_checkpoints_num: ``CheckpointConfig(num_to_keep)``, per trial; None (the
            default) keeps all.
        checkpoint_freq: For a ``tune.Trainable`` class:
            ``CheckpointConfig(checkpoint_frequency)``; 0 (the default) never.
        checkpoint_at_end: For a ``tune.Trainable`` class:
            ``CheckpointConfig(checkpoint_at_end)``; False by default.
        resume: ``"AUTO"`` or True continues the sweep; ``"ERRORED_ONLY"`` continues it
            with errored trials resumed too; False (the default) starts a new one, refused
            where the name already holds a sweep.
        restore: A checkpoint path that each trial of a function trainable starts from when
            it has none of its own, or the ``tune.SyncConfig`` the sweep was uploaded with;
            None (the default): neither.
        max_failures: ``FailureConfig(max_failures)``, per trial; default 0.
        max_concurrent_trials: ``TuneConfig(max_concurrent_trials)``; None (the default):
            as many as the ranks allow.
        verbose: 0 logs warnings only; 1, 2 (the default) or 3 log at INFO.
        scheduler: ``TuneConfig(scheduler)``; None (the default): FIFO.
        search_alg: ``TuneConfig(search_alg)``; None (the default): the grid and random
            draws of ``config``.
        time_budget_s: ``TuneConfig(time_budget_s)``; None (the default): no limit.
        **others: Ray's other keywords (resources, reporters, loggers): each is refused.

    Returns:
        The analysis of the sweep's results.

    Raises:
        ConfigError: An argument hpckit cannot honour or an invalid value, before any trial
            starts.
    """
    if mainimport.importing_main:  # a sweep's rank re-running the script stops here
        raise mainimport.MainImported()
    if others:
        first = sorted(others)[0]
        raise ConfigError(f"tune.run({first}=...) is not supported by hpckit (it has no Ray "
                          "resources, reporters or loggers); remove it. Multi-rank trials: pass "
                          "a DataParallelTrainer/TorchTrainer.")
    if resume not in RESUME:
        raise ConfigError(f"tune.run(resume={resume!r}) is invalid: use 'AUTO' (or True) to "
                          "continue the experiment, 'ERRORED_ONLY', or False for a new one.")
    if verbose not in (0, 1, 2, 3):
        raise ConfigError(f"tune.run(verbose={verbose!r}) must be 0, 1, 2 or 3.")
    stop = {"training_iteration": stop} if isinstance(stop, int) and not isinstance(stop, bool) \
        else stop
    trainable = _trainable(run_or_experiment, checkpoint_freq, checkpoint_at_end, stop, restore)
    root, mirror = _storage(local_dir, storage_path, sync_config, restore)
    experiment = str(name or getattr(run_or_experiment, "__name__", "trainable"))
    attr, order = score_attr(checkpoint_score_attr) if checkpoint_score_attr else (None, "max")
    run_config = RunConfig(
        name=experiment, storage_path=root, stop=stop,
        checkpoint_config=CheckpointConfig(num_to_keep=keep_checkpoints_num,
                                           checkpoint_score_attribute=attr,
                                           checkpoint_score_order=order),  # type: ignore[arg-type]
        failure_config=FailureConfig(max_failures=max_failures),
        sync_config=mirror(experiment),
        logging_config=LoggingConfig(log_level="WARNING" if verbose == 0 else "INFO"))
    tuner = Tuner(trainable, param_space=config or {},
                  tune_config=TuneConfig(metric=metric, mode=mode,  # type: ignore[arg-type]
                                         num_samples=num_samples,
                                         max_concurrent_trials=max_concurrent_trials,
                                         scheduler=scheduler, search_alg=search_alg,
                                         time_budget_s=time_budget_s),
                  run_config=run_config, _resume_errored=resume == "ERRORED_ONLY")
    _check_resume(tuner, resume)
    current = settings.refresh()
    logs.configure(world().rank if current.launcher is not None else 0)
    _say_deprecated(run_or_experiment, local_dir, sync_config, checkpoint_score_attr,
                    keep_checkpoints_num, checkpoint_freq or checkpoint_at_end, resume)
    return ExperimentAnalysis(tuner.fit(), metric, mode)


def _trainable(given: Any, freq: int, at_end: bool, stop: Any, restore: Any) -> Any:
    if isinstance(given, type) and issubclass(given, Trainable):
        if isinstance(restore, str):
            raise ConfigError("tune.run(restore=path) is for function trainables here; a "
                              "tune.Trainable resumes from its trial's own checkpoints.")
        return ClassRunner(given, freq, at_end, stop)
    if freq or at_end:
        raise ConfigError("tune.run(checkpoint_freq=..., checkpoint_at_end=...) needs a "
                          "tune.Trainable class, as in Ray: a function trainable checkpoints "
                          "when it reports with tune.checkpoint_dir().")
    if isinstance(given, DataParallelTrainer):
        return given
    if isinstance(given, str) or not callable(given):
        raise ConfigError(f"tune.run({given!r}) needs a function or a tune.Trainable class "
                          "(hpckit has no registry of named trainables).")
    return GuideFunction(given, restore if isinstance(restore, str) else None)


def _storage(local_dir: str | None, storage_path: str | None, sync: Any, restore: Any
             ) -> tuple[str | None, Callable[[str], RunSyncConfig]]:
    """The sweep's storage root, and the mirror (the syncer) each trial gets."""
    if isinstance(sync, RunSyncConfig):
        raise ConfigError("tune.run(sync_config=...) takes tune.SyncConfig(upload_dir=..., "
                          "syncer=...); hpckit's SyncConfig belongs in a RunConfig, with Tuner.")
    if sync is not None and not isinstance(sync, SyncConfig):
        raise ConfigError(f"tune.run(sync_config={sync!r}) must be a tune.SyncConfig.")
    if restore is not None and not isinstance(restore, (str, SyncConfig)):
        raise ConfigError(f"tune.run(restore={restore!r}) must be a checkpoint path, or the "
                          "sync_config the experiment was uploaded with.")
    if local_dir and storage_path and local_dir != storage_path:
        raise ConfigError("tune.run(local_dir=..., storage_path=...) name two places; give "
                          "storage_path only.")
    root = storage_path or local_dir
    if sync is None or sync.upload_dir is None:
        return root, lambda name: RunSyncConfig()
    if sync.syncer == "auto":
        return sync.upload_dir, lambda name: RunSyncConfig()
    upload = sync.upload_dir.rstrip("/")
    return root, lambda name: RunSyncConfig(mirror=f"{upload}/{name}", mirror_command=sync.syncer,
                                            sync_period=sync.sync_period)


def _check_resume(tuner: Tuner, resume: str | bool) -> None:
    if resume is not False:
        return
    location = tuner._location(settings.refresh())  # noqa: SLF001 (the same package)
    if Tuner.can_restore(location.path, None if location.is_local else location.filesystem):
        raise ConfigError(f"{location.display} already holds this experiment; pass "
                          "resume='AUTO' to continue it, or another name for a new one.")


def _say_deprecated(trainable: Any, local_dir: Any, sync: Any, attr: Any, keep: Any,
                    class_checkpoints: Any, resume: Any) -> None:
    """One line per legacy argument, naming today's Ray form (as Ray warns of them)."""
    lines = ["tune.run(...) is Ray Tune's older form; today: Tuner(trainable, "
             "param_space=config, tune_config=TuneConfig(...), run_config=RunConfig(...)).fit()"]
    if local_dir:
        lines.append("tune.run(local_dir=...) -> RunConfig(storage_path=...)")
    if sync is not None:
        lines.append("tune.SyncConfig(upload_dir=..., syncer=...) -> RunConfig(storage_path="
                     "upload_dir), or hpckit's SyncConfig(mirror=..., mirror_command=...)")
    if attr or keep:
        lines.append("checkpoint_score_attr=/keep_checkpoints_num= -> CheckpointConfig("
                     "checkpoint_score_attribute=..., checkpoint_score_order=..., num_to_keep=...)")
    if class_checkpoints:
        lines.append("checkpoint_freq=/checkpoint_at_end= -> CheckpointConfig(checkpoint_frequency"
                     "=..., checkpoint_at_end=...)")
    if resume not in (False,):
        lines.append("resume=... -> Tuner.restore(path, trainable), or run the script again")
    if callable(trainable) and takes_checkpoint_dir(trainable):
        lines.append("fn(config, checkpoint_dir) and tune.checkpoint_dir() -> tune.report("
                     "metrics, checkpoint=Checkpoint.from_directory(d)) and tune.get_checkpoint()")
    for line in lines:
        log.info("deprecated: %s", line)
