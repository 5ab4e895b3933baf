"""Experiment trackers (#52): each experiment one run in MLflow and in W&B (offline), kept
across a restart, a resume and a failure, each step logged once; TensorBoard shows each step
once. Real components: MLflow's sqlite store, W&B's offline run files, TensorBoard's events,
read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, manifest, metrics_lines, python, run
from support.mlflow_store import new_store
from support.wandb_files import offline_runs

TRACKED = HERE / "ranks" / "tracked.py"
LOSSES = [round(1 / (step + 2), 6) for step in range(8)]  # what steps 0-7 report


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow sqlite store for the module (making one costs seconds of migrations)."""
    return new_store(tmp_path_factory, "mlflow")


def mlflow_runs(uri: str, experiment: str, metric: str = "loss") -> list[dict]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    return [{"id": r.info.run_id, "name": r.info.run_name, "status": r.info.status,
             "params": r.data.params,
             "tags": r.data.tags,
             metric: [(m.step, round(m.value, 6)) for m in sorted(
                 client.get_metric_history(r.info.run_id, metric), key=lambda m: m.step)]}
            for r in client.search_runs([found.experiment_id])]


def tensorboard_steps(experiment: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(experiment / "tensorboard"))
    events.Reload()
    return [(e.step, round(e.value, 6)) for e in events.Scalars("loss")]


def tracked(tmp_path: Path, *args: str, expect: int | None = 0, env: dict | None = None):
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return python("--storage", str(tmp_path / "runs"), "--markers", str(markers), *args,
                  script=TRACKED, expect=expect, timeout=180,
                  env={"HPCKIT_TENSORBOARD": "1", **(env or {})})


def test_a_killed_and_restarted_experiment_is_one_mlflow_run_with_each_step_once(
        tmp_path, store):
    tracked(tmp_path, "--name", "restarted", "--tracker", "mlflow", "--uri", store,
            "--kill", "5")
    [mlflow_run] = mlflow_runs(store, "restarted")
    assert mlflow_run["status"] == "FINISHED" and mlflow_run["name"] == "restarted"
    assert mlflow_run["loss"] == [(step + 1, loss) for step, loss in enumerate(LOSSES)]
    assert mlflow_run["params"]["steps"] == "8"
    recorded = manifest(tmp_path / "runs" / "restarted")
    assert recorded["tracker_runs"] == {"mlflow": mlflow_run["id"]}
    assert len(recorded["attempts"]) == 2
    assert tensorboard_steps(tmp_path / "runs" / "restarted") == list(enumerate(LOSSES))


def test_an_experiment_that_failed_ends_its_mlflow_run_failed_and_a_resume_finishes_it(
        tmp_path, store):
    """``hpckit resume`` continues the same run, from the step after what it holds."""
    tracked(tmp_path, "--name", "resumed", "--tracker", "mlflow", "--uri", store,
            "--kill", "5", "--no-restart", expect=None)
    [failed] = mlflow_runs(store, "resumed")
    assert failed["status"] == "FAILED"  # rank 0 was killed: the launching process ended it
    tracked_failure = tracked(tmp_path, "--name", "failing", "--tracker", "mlflow", "--uri",
                              store, "--fail", expect=None)
    assert tracked_failure.returncode != 0
    assert [r["status"] for r in mlflow_runs(store, "failing")] == ["FAILED"]
    run([HPCKIT, "resume", str(tmp_path / "runs" / "resumed")], timeout=180)
    [resumed] = mlflow_runs(store, "resumed")
    assert resumed["id"] == failed["id"] and resumed["status"] == "FINISHED"
    assert resumed["loss"] == [(step + 1, loss) for step, loss in enumerate(LOSSES)]


def test_setup_mlflow_gives_the_training_function_the_same_run_after_a_restart(tmp_path, store):
    out = tracked(tmp_path, "--name", "set-up", "--setup", "mlflow", "--uri", store,
                  "--kill", "5")
    ids = re.findall(r"SETUP (\w+)", out.output)
    assert len(ids) == 2 and len(set(ids)) == 1, out.output
    [mlflow_run] = mlflow_runs(store, "set-up")
    assert mlflow_run["id"] == ids[0] and mlflow_run["status"] == "FINISHED"
    assert mlflow_run["params"] == {"lr": "0.1"}


def test_setup_mlflow_refuses_a_missing_experiment_as_ray_does_and_says_the_fix(store,
                                                                                  monkeypatch):
    """Ray raises ValueError where the named experiment is missing and may not be made; a Ray
    program's ``except ValueError`` still catches hpckit's ConfigError."""
    import mlflow

    from hpckit.errors import ConfigError
    from hpckit.integrations.mlflow import _experiment

    for variable in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID"):  # mlflow sets them
        monkeypatch.setenv(variable, "")  # so that the test's end restores them
        monkeypatch.delenv(variable)
    mlflow.set_tracking_uri(store)
    with pytest.raises(ValueError, match="create_experiment_if_not_exists=True") as raised:
        _experiment(None, "never-made", None, create=False)
    assert isinstance(raised.value, ConfigError)
    assert mlflow.get_experiment_by_name("never-made") is None
    made = _experiment(None, "never-made", None, create=True)
    assert mlflow.get_experiment_by_name("never-made").experiment_id == made


def test_a_tracker_run_is_opened_only_once_the_first_report_is_committed():
    """#66: the thread that opened the tracker run as the experiment opened competed with
    the start of training (on 2 cores the first report came 0.04 s after the attempt's start
    with an unreachable MLflow, 0.014 s without). It now opens at the first commit."""
    import threading

    from hpckit.config.callbacks import TrackedExperiment, TrackerCallback
    from hpckit.experiment.attempts import AttemptStatus
    from hpckit.experiment.tracking import Trackers

    opened = threading.Event()
    logged: list[int] = []

    class Run:
        run_id, next_step = "run-1", 0

        def log(self, step, metrics):
            logged.append(step)

        def end(self, status):
            pass

    class Callback(TrackerCallback):
        tracker = "test"

        def open_run(self, run_id, experiment):
            opened.set()
            return Run()

    trackers = Trackers.open([Callback()], {}, TrackedExperiment("exp", "/tmp/exp"), None)
    assert not opened.wait(0.5), "the run was opened before any report was committed"
    trackers.log(0, {"loss": 1.0})
    assert opened.wait(10)
    trackers.end(AttemptStatus.FINISHED)
    assert logged == [0] and trackers.run_ids == {"test": "run-1"}


def test_a_wandb_offline_run_keeps_its_id_across_a_restart(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    tracked(tmp_path, "--name", "wandb-restarted", "--tracker", "wandb", "--kill", "5",
            env=env)
    recorded = manifest(tmp_path / "runs" / "wandb-restarted")
    assert len(recorded["attempts"]) == 2
    # W&B names an offline run's directory by the second its attempt opened it and the run's
    # id: two attempts opened in the same second share one directory.
    directories = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert {d.name.rsplit("-", 1)[1] for d in directories} == {recorded["tracker_runs"]["wandb"]}
    last = offline_runs(tmp_path)[-1]
    assert last["id"] == recorded["tracker_runs"]["wandb"]
    assert last["exit_code"] == 0
    steps = [row["_step"] for row in last["history"]]
    assert steps == sorted(set(steps)) and steps[-1] == 8


def test_setup_wandb_gives_the_training_function_the_same_run_after_a_restart(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    out = tracked(tmp_path, "--name", "wandb-set-up", "--setup", "wandb", "--kill", "5",
                  env=env)
    ids = re.findall(r"SETUP (\w+)", out.output)
    assert len(ids) == 2 and len(set(ids)) == 1, out.output
    assert offline_runs(tmp_path)[-1]["exit_code"] == 0


def test_a_sweep_logs_each_trial_as_a_run_of_its_own_under_the_sweeps_name(tmp_path, store):
    python("--storage", str(tmp_path), "--mlflow", store, script=HERE / "ranks" / "sweep.py",
           timeout=180)
    runs = mlflow_runs(store, "grid", "score")  # the MLflow experiment is the sweep
    assert len(runs) == 3 and {r["status"] for r in runs} == {"FINISHED"}
    assert sorted(r["name"] for r in runs) == sorted(r["tags"]["trial_id"] for r in runs)
    assert len({r["name"] for r in runs}) == 3
    assert sorted(r["params"]["lr"] for r in runs) == ["0.1", "0.2", "0.3"]
    assert all([step for step, _ in r["score"]] == [1, 2, 3] for r in runs)


def test_an_unreachable_mlflow_costs_the_run_one_warning(tmp_path):
    """#66: MLflowLoggerCallback(tracking_uri="http://127.0.0.1:9"): nothing was printed for
    200 s while MLflow retried inside the experiment's opening, on every attempt. The
    tracker is now opened on a thread of its own with bounded retries: the run trains and
    commits every step as without it, and says once that MLflow is left out."""
    out = tracked(tmp_path, "--name", "unreachable", "--tracker", "mlflow", "--uri",
                  "http://127.0.0.1:9").output
    warnings = [line for line in out.splitlines() if "mlflow" in line and "WARNING" in line]
    assert len(warnings) == 1 and "could not open the mlflow run" in warnings[0], out
    experiment = tmp_path / "runs" / "unreachable"
    assert [line["step"] for line in metrics_lines(experiment)] == list(range(8))
    assert manifest(experiment)["tracker_runs"] == {}
    assert manifest(experiment)["attempts"][-1]["status"] == "finished"


def test_a_deleted_mlflow_run_is_replaced_by_a_new_one_that_has_every_step(tmp_path, store):
    """#66: the MLflow run that the manifest records was deleted between attempts: every
    later attempt warned "must be in the 'active' state" and logged nothing more. Now the
    resume makes a new run, records it, says so once, and sends it every committed step."""
    from mlflow import MlflowClient

    tracked(tmp_path, "--name", "deleted", "--tracker", "mlflow", "--uri", store, "--steps", "4")
    [first] = mlflow_runs(store, "deleted")
    MlflowClient(store).delete_run(first["id"])
    out = tracked(tmp_path, "--name", "deleted", "--tracker", "mlflow", "--uri", store).output
    assert out.count("was deleted: the experiment goes on in a new run") == 1, out
    [second] = mlflow_runs(store, "deleted")  # the deleted one is not listed
    assert second["id"] != first["id"] and second["status"] == "FINISHED"
    assert second["loss"] == [(step + 1, loss) for step, loss in enumerate(LOSSES)]
    assert manifest(tmp_path / "runs" / "deleted")["tracker_runs"] == {"mlflow": second["id"]}
