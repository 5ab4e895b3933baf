"""``setup_wandb``: the training function's W&B run, the experiment's one across restarts
and resumes."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import wandb

from hpckit.integrations.tracking import NoopModule, recorded_run, tracking_rank
from hpckit.integrations.wandb.callback import WandbRun, use_api_key
from hpckit.run.session.session import current


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
