"""Weights & Biases on hpckit, as Ray offers it in ``ray.air.integrations.wandb``: the logger
callback (``WandbLoggerCallback``: each experiment, each trial of a sweep, one W&B run, kept
across restarts, requeues and ``hpckit resume`` by its id, fed by rank 0's experiment
writer) and ``setup_wandb`` (the training function's W&B run, the experiment's one across
restarts and resumes). Public names in :mod:`hpckit.wandb`; the ``wandb`` package is an
optional extra (``pip install -e '.[wandb]'`` in hpckit's clone) that only this module
imports."""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Any

import wandb

from hpckit.config.callbacks import TrackedExperiment, TrackerCallback
from hpckit.integrations.tracking import NoopModule, numbers, recorded_run, tracking_rank
from hpckit.run.session.session import current

FINISH_CODES = {"FINISHED": 0, "FAILED": 1, "KILLED": 2}
INIT_TIMEOUT_S = 30.0  # wandb.init's wait for its service and server, where none is set


class WandbLoggerCallback(TrackerCallback):
    """Ray's ``WandbLoggerCallback``, for ``RunConfig(callbacks=[...])`` of a trainer or a
    ``Tuner``: one W&B run per experiment (per trial in a sweep), named after it, in
    ``project`` ($WANDB_PROJECT, else the sweep's name or the experiment's own) and
    ``group`` (the sweep's name in a sweep); every other keyword goes to ``wandb.init``.
    Each report's numeric metrics but ``excludes`` are logged at its ``training_iteration``
    (the metrics log's step + 1, as in Ray); ``log_config``
    puts the training function's config in the run's config.

    Unlike Ray's, the run is kept across restarts, requeues and resumes (``resume="allow"``
    with the id the manifest records) and ends with exit code 0, 1 or 2 as the experiment
    finished, failed or was stopped.

    Args:
        project: The W&B project; None (the default): ``$WANDB_PROJECT``, else the sweep's
            name, else the experiment's (Ray requires one).
        group: The W&B group; None (the default): the sweep's name in a sweep, else none.
        api_key_file: A file holding the W&B API key, set as ``$WANDB_API_KEY`` on the rank
            that opens the run (never logged nor recorded); None (the default): none.
        api_key: The W&B API key itself, where no ``api_key_file`` is given; None (the
            default) leaves the environment's.
        excludes: Metric names not to log; None (the default) logs every numeric metric.
        log_config: Put the training function's config in the run's config; False by
            default.
        upload_checkpoints: Accepted for Ray's signature and ignored: checkpoints stay in
            the experiment.
        save_checkpoints: As ``upload_checkpoints`` (Ray's older name).
        upload_timeout: Accepted for Ray's signature and ignored.
        **kwargs: More keywords for ``wandb.init`` (``entity``, ``tags``, ``settings``,
            ...); they win over hpckit's.
    """

    tracker = "wandb"

    def __init__(self, project: str | None = None, group: str | None = None,
                 api_key_file: str | None = None, api_key: str | None = None,
                 excludes: list[str] | None = None, log_config: bool = False,
                 upload_checkpoints: bool = False, save_checkpoints: bool = False,
                 upload_timeout: int = 1800, **kwargs: Any) -> None:
        self.project = project
        self.group = group
        self.api_key_file = api_key_file
        self.api_key = api_key
        self.excludes = list(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints or save_checkpoints
        self.upload_timeout = upload_timeout
        self.kwargs = kwargs

    def new_run_id(self) -> str:
        """W&B takes the id it is given: the manifest records it before the run opens."""
        return secrets.token_hex(4)

    def open_run(self, run_id: str | None, experiment: TrackedExperiment) -> WandbRun:
        use_api_key(self.api_key_file, self.api_key)
        kwargs = dict(self.kwargs)
        settings = kwargs.pop("settings", None) or wandb.Settings()
        if "init_timeout" not in settings.model_fields_set:  # W&B's own bound: 90 s
            settings.init_timeout = INIT_TIMEOUT_S
        run = wandb.init(**{
            "id": run_id or secrets.token_hex(4), "resume": "allow", "settings": settings,
            "name": experiment.name,
            "project": self.project or os.environ.get("WANDB_PROJECT")
            or experiment.group or experiment.name,
            "group": self.group or experiment.group,
            "config": experiment.config if self.log_config else None,
            "reinit": "create_new", **kwargs})
        return WandbRun(run, self.excludes)


class WandbRun:
    """One experiment's W&B run, opened by :class:`WandbLoggerCallback`."""

    def __init__(self, run: Any, excludes: list[str]) -> None:
        self.run = run
        self.run_id: str = run.id
        self.excludes = excludes
        # W&B's next step is its next training_iteration (hpckit's step + 1); offline, a
        # resumed run does not know its steps (0), and W&B drops a repeated one when it syncs.
        self.next_step = max(int(run.step) - 1, 0)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """At Ray's step, the report's ``training_iteration``: ``step + 1``."""
        logged = {k: v for k, v in numbers(metrics).items() if k not in self.excludes}
        self.run.log(logged, step=step + 1)

    def end(self, status: str) -> None:
        self.run.finish(exit_code=FINISH_CODES.get(status, 1))


def use_api_key(api_key_file: str | None, api_key: str | None) -> None:
    """Ray's ``api_key_file``/``api_key``: the key for wandb, through its environment
    variable (never logged)."""
    if api_key_file:
        with open(os.path.expanduser(api_key_file)) as f:
            os.environ["WANDB_API_KEY"] = f.read().strip()
    elif api_key:
        os.environ["WANDB_API_KEY"] = api_key


def setup_wandb(config: dict[str, Any] | None = None, api_key_file: str | None = None,
                api_key: str | None = None, rank_zero_only: bool = True, **kwargs: Any) -> Any:
    """Ray's ``setup_wandb``, called in the training function: the experiment's W&B run on
    rank 0 (on every rank without ``rank_zero_only``; the other ranks get an object whose
    functions do nothing). Its id is the experiment's ``WandbLoggerCallback`` run's where
    the run has one, else one made from the experiment's path, so that every restart and
    resume continues the same run (``resume="allow"``); keywords go to ``wandb.init``. It
    ends as the attempt ends (exit code 0 when it finished).

    Args:
        config: The run's config (typically ``train_loop_config``); None (the default):
            none.
        api_key_file: A file holding the W&B API key, set as ``$WANDB_API_KEY`` on this
            rank (never logged nor recorded); None (the default): none.
        api_key: The W&B API key itself, where no ``api_key_file`` is given; None (the
            default) leaves the environment's.
        rank_zero_only: Track on rank 0 only (True, the default); False opens the run on
            every rank.
        **kwargs: More keywords for ``wandb.init`` (``project``, ``entity``, ``tags``,
            ...); they win over hpckit's (the project is otherwise ``$WANDB_PROJECT``, else
            the experiment's name).

    Returns:
        The ``wandb`` run, or on a rank that does not track an object whose calls do
        nothing.

    Raises:
        HpckitError: Called outside a training run.
    """
    if not tracking_rank("setup_wandb", rank_zero_only):
        return NoopModule()
    use_api_key(api_key_file, api_key)
    recorded, name, path = recorded_run("setup_wandb", "wandb")
    run = wandb.init(**{
        "id": recorded or hashlib.sha256(path.encode()).hexdigest()[:16], "resume": "allow",
        "name": name, "project": os.environ.get("WANDB_PROJECT") or name, "config": config,
        "reinit": "create_new", **kwargs})
    current("setup_wandb").tracked.runs["setup_wandb"] = WandbRun(run, [])
    return run
