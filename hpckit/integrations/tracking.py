"""What the tracker integrations (``integrations/mlflow.py``, ``integrations/wandb.py``) share:
metrics as a tracker takes them, the stand-in module of the ranks that do not track, and the
experiment a training function's tracker run belongs to."""

from __future__ import annotations

import math
from typing import Any

from hpckit.experiment.values import flatten
from hpckit.run.session.session import current


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics, nested ones as ``outer/inner`` (Ray's flattening); others are
    left out, as trackers take numbers only."""
    return {key: float(value) for key, value in flatten(metrics).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


def params(config: dict[str, Any]) -> dict[str, str]:
    """A configuration as a tracker's parameters: flattened, each value as text."""
    return {key: str(value) for key, value in flatten(config).items()}


class NoopModule:
    """What ``setup_mlflow``/``setup_wandb`` return on the ranks that do not track: every
    attribute a function that does nothing (Ray's ``_NoopModule``)."""

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self


def tracking_rank(caller: str, rank_zero_only: bool) -> bool:
    """Whether this rank tracks: rank 0, or every rank without ``rank_zero_only``."""
    return not rank_zero_only or current(caller).context.get_world_rank() == 0


def recorded_run(caller: str, tracker: str) -> tuple[str | None, str, str]:
    """On rank 0: the experiment's run in ``tracker`` as its manifest records it (a
    ``TrackerCallback``'s), the experiment's name and its path."""
    session = current(caller)
    experiment = session.protocol.experiment
    recorded = experiment.manifest.tracker_runs.get(tracker) if experiment is not None else None
    return recorded, session.context.get_experiment_name(), session.context.get_experiment_path()
