"""MLflow on hpckit, as Ray offers it in ``ray.air.integrations.mlflow``: the logger callback
(``MLflowLoggerCallback``: each experiment, each trial of a sweep, one MLflow run, kept across
restarts, requeues and ``hpckit resume``, fed by rank 0's experiment writer) and
``setup_mlflow`` (the training function's own MLflow run, the experiment's one across
restarts and resumes). Public names in :mod:`hpckit.mlflow`; the ``mlflow`` package is an
optional extra (``pip install -e '.[mlflow]'`` in hpckit's clone) that only this module
imports."""

from __future__ import annotations

import os
import time
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from hpckit.config.callbacks import TrackedExperiment, TrackerCallback
from hpckit.errors import ConfigError
from hpckit.integrations.tracking import NoopModule, numbers, params, recorded_run, tracking_rank
from hpckit.logs import log
from hpckit.run.session.session import current

EXPERIMENT_TAG = "hpckit.experiment"  # the experiment directory a run keeps
# MLflow's own bounds on a request, where the environment sets none: a tracking server that
# does not answer costs its thread about a minute, not the ~4 of MLflow's defaults.
BOUNDED = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


class MLflowLoggerCallback(TrackerCallback):
    """Ray's ``MLflowLoggerCallback``, for ``RunConfig(callbacks=[...])`` of a trainer or a
    ``Tuner``: one MLflow run per experiment (per trial in a sweep), named after it, in the
    MLflow experiment ``experiment_name`` ($MLFLOW_EXPERIMENT_NAME, else the sweep's name or
    the experiment's own), created where missing. The run's parameters are the training
    function's config; each report's numeric metrics are logged at its ``training_iteration`` (the metrics
    log's step + 1), as in Ray.

    Unlike Ray's, the run is kept across restarts, requeues and ``hpckit resume`` (the
    manifest records its id), ends ``FINISHED``, ``FAILED`` or ``KILLED`` as the experiment
    did, and logs ``report()``'s numeric metrics only (Ray: the whole result).

    Args:
        tracking_uri: The MLflow tracking server or store; None (the default) is MLflow's
            own choice (``$MLFLOW_TRACKING_URI``, else ``./mlruns``).
        registry_uri: The MLflow model registry; None (the default) is MLflow's own choice.
        experiment_name: The MLflow experiment the runs go into, created where missing;
            None (the default): ``$MLFLOW_EXPERIMENT_NAME``, else the sweep's name, else the
            experiment's own.
        tags: Tags set on each new run (values as strings), beside hpckit's
            ``hpckit.experiment`` (and ``trial_id`` in a sweep). None (the default): none.
        tracking_token: Set as ``$MLFLOW_TRACKING_TOKEN`` for the tracking server; None (the
            default) leaves the environment as it is.
        save_artifact: At the end of each attempt, upload the experiment directory (on
            local storage) as the run's artifacts; False by default.
        log_params_on_trial_end: Log the run's parameters when it finishes instead of when
            it opens; False by default.
    """

    tracker = "mlflow"

    def __init__(self, tracking_uri: str | None = None, *, registry_uri: str | None = None,
                 experiment_name: str | None = None, tags: dict[str, Any] | None = None,
                 tracking_token: str | None = None, save_artifact: bool = False,
                 log_params_on_trial_end: bool = False) -> None:
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end

    def open_run(self, run_id: str | None, experiment: TrackedExperiment) -> MLflowRun:
        if self.tracking_token:
            os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
        for variable, value in BOUNDED.items():  # a server that does not answer: minutes, not
            os.environ.setdefault(variable, value)  # MLflow's default of about 4 (7 retries)
        client = MlflowClient(self.tracking_uri, self.registry_uri)
        name = (self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                or experiment.group or experiment.name)
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(name)
        if run_id is None:  # a run the manifest did not record yet (killed before it could)
            run_id = _tagged(client, experiment_id, experiment.path)
        if run_id is not None:
            if _active(client, run_id):
                client.update_run(run_id, status="RUNNING")
                return MLflowRun(client, run_id, experiment, self, _logged_until(client, run_id))
            log.warning("the MLflow run %s of experiment %s was deleted: the experiment goes on "
                        "in a new run, which its manifest records", run_id, experiment.name)
        tags = {**{k: str(v) for k, v in self.tags.items()}, EXPERIMENT_TAG: experiment.path}
        if experiment.trial_id:
            tags["trial_id"] = experiment.trial_id
        run = client.create_run(experiment_id, run_name=experiment.name, tags=tags)
        opened = MLflowRun(client, run.info.run_id, experiment, self)
        if not self.log_params_on_trial_end:
            opened.log_params()
        return opened


def _active(client: MlflowClient, run_id: str) -> bool:
    """Whether the tracking store still has ``run_id``, not deleted."""
    try:
        return bool(client.get_run(run_id).info.lifecycle_stage != "deleted")
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise


def _tagged(client: MlflowClient, experiment_id: str, path: str) -> str | None:
    """The newest active run that hpckit tagged with this experiment's path, if any."""
    quoted = path.replace("\\", "\\\\").replace("'", "\\'")
    runs = client.search_runs([experiment_id], f"tags.`{EXPERIMENT_TAG}` = '{quoted}'",
                              max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


def _logged_until(client: MlflowClient, run_id: str) -> int:
    """The first step (hpckit's) that ``run_id`` holds no metric of: its highest
    ``training_iteration``, read back from the tracking store."""
    keys = client.get_run(run_id).data.metrics
    return max((m.step for key in keys for m in client.get_metric_history(run_id, key)),
               default=0)


class MLflowRun:
    """One experiment's MLflow run, opened by :class:`MLflowLoggerCallback`."""

    def __init__(self, client: MlflowClient, run_id: str, experiment: TrackedExperiment,
                 callback: MLflowLoggerCallback, next_step: int = 0) -> None:
        self.client = client
        self.run_id = run_id
        self.experiment = experiment
        self.callback = callback
        self.next_step = next_step

    def log_params(self) -> None:
        self.client.log_batch(self.run_id, params=[
            Param(key, value) for key, value in params(self.experiment.config).items()])

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """At Ray's step, the report's ``training_iteration``: ``step + 1``."""
        at = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            Metric(key, value, at, step + 1) for key, value in numbers(metrics).items()])

    def end(self, status: str) -> None:
        if self.callback.log_params_on_trial_end and status == "FINISHED":
            self.log_params()
        if self.callback.save_artifact and os.path.isdir(self.experiment.path):
            self.client.log_artifacts(self.run_id, self.experiment.path)
        self.client.log_batch(self.run_id, tags=[RunTag("hpckit.ended", status)])
        self.client.set_terminated(self.run_id, status)


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
        ConfigError: ``experiment_name`` names no MLflow experiment and
            ``create_experiment_if_not_exists`` is False (a ``ValueError``, as Ray raises).
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
            raise ConfigError(f"setup_mlflow(experiment_name={name!r}): the tracking server has "
                              "no MLflow experiment of that name; create it, or pass "
                              "create_experiment_if_not_exists=True.")
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
