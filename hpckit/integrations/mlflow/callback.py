"""``MLflowLoggerCallback``: each experiment (each trial of a sweep) one MLflow run, kept
across restarts, requeues and ``hpckit resume``, fed by rank 0's experiment writer."""

from __future__ import annotations

import os
import time
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from hpckit.config.callbacks import TrackedExperiment, TrackerCallback
from hpckit.integrations.tracking import numbers, params

EXPERIMENT_TAG = "hpckit.experiment"  # the experiment directory a run keeps


class MLflowLoggerCallback(TrackerCallback):
    """Ray's ``MLflowLoggerCallback``, for ``RunConfig(callbacks=[...])`` of a trainer or a
    ``Tuner``: one MLflow run per experiment (per trial in a sweep), named after it, in the
    MLflow experiment ``experiment_name`` ($MLFLOW_EXPERIMENT_NAME, else the sweep's name or
    the experiment's own), created where missing. The run's parameters are the training
    function's config; each report's numeric metrics are logged at its ``training_iteration`` (the metrics
    log's step + 1), as in Ray."""

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
        client = MlflowClient(self.tracking_uri, self.registry_uri)
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return MLflowRun(client, run_id, experiment, self, _logged_until(client, run_id))
        name = (self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                or experiment.group or experiment.name)
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(name)
        tags = {**{k: str(v) for k, v in self.tags.items()}, EXPERIMENT_TAG: experiment.path}
        if experiment.trial_id:
            tags["trial_id"] = experiment.trial_id
        run = client.create_run(experiment_id, run_name=experiment.name, tags=tags)
        opened = MLflowRun(client, run.info.run_id, experiment, self)
        if not self.log_params_on_trial_end:
            opened.log_params()
        return opened


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
