"""``setup_mlflow``: the training function's MLflow run, the experiment's one across
restarts and resumes."""

from __future__ import annotations

import os
from typing import Any

import mlflow

from hpckit.integrations.mlflow.callback import EXPERIMENT_TAG
from hpckit.integrations.tracking import NoopModule, params, recorded_run, tracking_rank
from hpckit.run.session.session import current


def setup_mlflow(config: dict[str, Any] | None = None, tracking_uri: str | None = None,
                 registry_uri: str | None = None, experiment_id: str | None = None,
                 experiment_name: str | None = None, tracking_token: str | None = None,
                 artifact_location: str | None = None, run_name: str | None = None,
                 create_experiment_if_not_exists: bool = False,
                 tags: dict[str, Any] | None = None, rank_zero_only: bool = True) -> Any:
    """Ray's ``setup_mlflow``, called in the training function: the ``mlflow`` module with
    the experiment's run active, on rank 0 (on every rank without ``rank_zero_only``; the
    other ranks get a module whose functions do nothing). The run is the experiment's
    ``MLflowLoggerCallback`` run where the run has one; else the run this function started
    for the experiment before (found by its ``hpckit.experiment`` tag), or a new one named
    ``run_name`` (default: the experiment's name), whose parameters are ``config``. It ends
    as the attempt ends (finished, failed, or killed: stopped or interrupted).

    Args:
        config: The run's parameters, logged when a new run starts (typically
            ``train_loop_config``); None (the default): none.
        tracking_uri: The MLflow tracking server or store; None (the default) leaves
            MLflow's own choice.
        registry_uri: The MLflow model registry; None (the default) leaves MLflow's own.
        experiment_id: The MLflow experiment to use; None (the default):
            ``experiment_name``, else ``$MLFLOW_EXPERIMENT_ID``.
        experiment_name: The MLflow experiment to use, by name, where no id is given; None
            (the default): ``$MLFLOW_EXPERIMENT_NAME``, else MLflow's default experiment.
        tracking_token: Set as ``$MLFLOW_TRACKING_TOKEN``; None (the default) leaves the
            environment as it is.
        artifact_location: Where a created experiment keeps its artifacts; None (the
            default) is MLflow's choice.
        run_name: A new run's name; None (the default) is the experiment's name.
        create_experiment_if_not_exists: Create the experiment ``experiment_name`` where
            MLflow has none; False (the default) refuses.
        tags: Tags set on a new run (values as strings), beside hpckit's
            ``hpckit.experiment``; None (the default): none.
        rank_zero_only: Track on rank 0 only (True, the default); False gives every rank
            the ``mlflow`` module with its run active.

    Returns:
        The ``mlflow`` module, or on a rank that does not track an object whose functions
        do nothing.

    Raises:
        ValueError: ``experiment_name`` names no MLflow experiment and
            ``create_experiment_if_not_exists`` is False.
        HpckitError: Called outside a training run.
    """
    if not tracking_rank("setup_mlflow", rank_zero_only):
        return NoopModule()
    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if registry_uri:
        mlflow.set_registry_uri(registry_uri)
    experiment = _experiment(experiment_id, experiment_name, artifact_location,
                             create_experiment_if_not_exists)
    recorded, name, path = recorded_run("setup_mlflow", "mlflow")
    run_id = recorded or _started_before(experiment, path)
    if run_id is not None:
        mlflow.start_run(run_id=run_id)
    else:
        mlflow.start_run(run_name=run_name or name,
                         tags={**{k: str(v) for k, v in (tags or {}).items()}, EXPERIMENT_TAG: path})
        if config:
            mlflow.log_params(params(config))
    current("setup_mlflow").tracked.runs["setup_mlflow"] = _Active()
    return mlflow


def _experiment(experiment_id: str | None, experiment_name: str | None,
                artifact_location: str | None, create: bool) -> str | None:
    """The MLflow experiment's id, made the active one (None: MLflow's default), as Ray
    chooses it: the id, else the name (created where ``create``), else
    $MLFLOW_EXPERIMENT_ID / $MLFLOW_EXPERIMENT_NAME."""
    chosen = experiment_id or os.environ.get("MLFLOW_EXPERIMENT_ID")
    name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if not chosen and name:
        found = mlflow.get_experiment_by_name(name)
        if found is None and not create:
            raise ValueError(f"setup_mlflow(experiment_name={name!r}): no such MLflow "
                             "experiment; create it, or pass create_experiment_if_not_exists=True.")
        chosen = (str(found.experiment_id) if found is not None
                  else str(mlflow.create_experiment(name, artifact_location=artifact_location)))
    if chosen:
        mlflow.set_experiment(experiment_id=chosen)
    return chosen


def _started_before(experiment: str | None, path: str) -> str | None:
    """The run setup_mlflow started for this experiment in an earlier attempt."""
    found = mlflow.search_runs(experiment_ids=[experiment] if experiment else None,
                               filter_string=f"tags.`{EXPERIMENT_TAG}` = '{path}'",
                               max_results=1, output_format="list")
    return found[0].info.run_id if found else None


class _Active:
    """The active run, ended as the attempt ends (so that MLflow's own end at exit does not
    mark a failed attempt finished)."""

    run_id = "active"
    next_step = 0

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """The training function logs its own metrics to this run."""

    def end(self, status: str) -> None:
        mlflow.end_run(status)
