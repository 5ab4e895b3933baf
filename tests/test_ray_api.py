"""Ray Train 2.60's API as Ray programs use it: the programs below are written as for Ray
(`ray.train` names imported from hpckit) and check what Ray documents and does."""

from __future__ import annotations

import logging
import os
import re
import tempfile

import pytest
from conftest import HERE, mpiexec

import hpckit as train  # as a Ray program writes `from ray import train`
from hpckit import (
    Checkpoint,
    CheckpointConfig,
    CheckpointConsistencyMode,
    DataParallelTrainer,
    ReportedCheckpointStatus,
    Result,
    RunConfig,
)

RANKS = HERE / "ranks" / "reported.py"


def _report_scores(config: dict) -> str:
    for i, metrics in enumerate(config["metrics"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "i.txt"), "w") as f:
                f.write(str(i))
            train.report(metrics, checkpoint=Checkpoint.from_directory(d))
    return "done"


def _fit(tmp_path, metrics: list[dict], keep: int | None, attribute: str | None,
         order: str = "max", name: str = "e") -> Result:
    checkpoint_config = CheckpointConfig(num_to_keep=keep, checkpoint_score_attribute=attribute,
                                         checkpoint_score_order=order)
    return DataParallelTrainer(
        _report_scores, train_loop_config={"metrics": metrics},
        run_config=RunConfig(name=name, storage_path=str(tmp_path),
                             checkpoint_config=checkpoint_config)).fit()


def _indexes(result: Result) -> list[int]:
    return [int(c.path.rsplit("_", 1)[1]) for c, _ in result.best_checkpoints]


@pytest.mark.parametrize("order,keep,expected", [
    ("max", 2, [1, 4]),           # scores 0.3 0.9 0.1 0.2 0.95: 0.9 then 0.95, best last
    ("min", 2, [3, 2]),           # 0.2 then 0.1; the latest (0.95) is kept but not listed
    ("max", None, [2, 3, 0, 1, 4]),
    ("min", None, [4, 1, 0, 3, 2]),
])
def test_best_checkpoints_are_worst_to_best_and_at_most_num_to_keep(tmp_path, order, keep, expected):
    scores = [0.3, 0.9, 0.1, 0.2, 0.95]
    result = _fit(tmp_path, [{"acc": s} for s in scores], keep, "acc", order)
    if keep == 2 and order == "min":
        # the last report (0.95) is kept on storage to resume from, but it is not a best one
        assert result.checkpoint.path.endswith("checkpoint_000004")
    assert _indexes(result) == expected
    best = result.best_checkpoints[-1][1]["acc"]
    assert best == (max(scores) if order == "max" else min(scores))
    assert result.return_value == "done"


def test_without_a_score_best_checkpoints_are_the_latest_in_report_order(tmp_path):
    result = _fit(tmp_path, [{"loss": 1.0}] * 4, 2, None)
    assert _indexes(result) == [2, 3]


@pytest.mark.parametrize("metrics", [
    {"nested": {"sub": {"attr": 5.0}}},
    {"nested": {"sub/attr": 5.0}},
    {"nested/sub": {"attr": 5.0}},
    {"nested/sub/attr": 5.0},
])
def test_nested_score_attributes_are_found_in_all_four_forms(tmp_path, metrics):
    low = {"nested/sub/attr": 1.0}
    result = _fit(tmp_path, [low, metrics, low, low], 1, "nested/sub/attr")
    assert _indexes(result) == [1]
    assert (tmp_path / "e" / "checkpoint_000001").is_dir()  # kept on storage, not deleted
    assert result.get_best_checkpoint("nested/sub/attr", "max").path.endswith("checkpoint_000001")


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_score_attribute_never_reported_is_said_once(tmp_path):
    kept = _Kept()
    logging.getLogger("hpckit").addHandler(kept)  # hpckit's logger does not propagate
    try:
        _fit(tmp_path, [{"loss": 1.0}, {"loss": 0.5}, {"loss": 0.2}], 2, "accuracy")
    finally:
        logging.getLogger("hpckit").removeHandler(kept)
    said = [m for m in kept.messages if "checkpoint_score_attribute" in m]
    assert len(said) == 1 and "'accuracy'" in said[0] and "loss" in said[0], kept.messages


def test_result_is_built_as_ray_builds_it():
    checkpoint = Checkpoint.from_directory("/tmp")
    bare = Result(metrics={"loss": 1.0}, checkpoint=None, error=None, path="/tmp/x")
    assert bare.best_checkpoints == [] and bare.return_value is None
    assert bare.filesystem.type_name == "local"
    with pytest.raises(RuntimeError, match="no checkpoint"):
        bare.get_best_checkpoint("loss", "min")
    given = Result({"a": 1}, checkpoint, None, "/tmp/x", None,
                   [(checkpoint, {"a": 1}), (Checkpoint.from_directory("/"), {"a": 3})],
                   None, 42)
    assert given.get_best_checkpoint("a", "max").path == "/" and given.return_value == 42
    assert given.get_best_checkpoint("a", "min") is checkpoint
    with pytest.raises(RuntimeError, match="'accuracy'.*reported: a"):
        given.get_best_checkpoint("accuracy", "max")
    with pytest.raises(ValueError):
        given.get_best_checkpoint("a", "best")


def test_a_missing_experiment_is_a_runtime_error(tmp_path):
    with pytest.raises(RuntimeError):
        Result.from_path(tmp_path / "never")


def _fails(config: dict) -> None:
    raise KeyError("a bug in the training function")


def test_a_training_failure_is_a_worker_group_error_with_each_rank(tmp_path):
    trainer = DataParallelTrainer(_fails, run_config=RunConfig(name="f", storage_path=str(tmp_path)))
    with pytest.raises(train.TrainingFailedError) as caught:  # what a Ray program catches
        trainer.fit()
    assert isinstance(caught.value, train.WorkerGroupError)
    assert list(caught.value.worker_failures) == [0]
    assert isinstance(caught.value.worker_failures[0], KeyError)


def test_all_reported_checkpoints_on_every_rank_and_after_a_resume(tmp_path):
    out = mpiexec(3, "--storage", str(tmp_path), "--reports", "3", script=RANKS, timeout=120)
    assert re.findall(r"SEEN (\[[^]]*\] \w+)", out.output) == ["[0, 1, 2] COMMITTED"] * 3, out.output
    again = mpiexec(3, "--storage", str(tmp_path), "--reports", "5", script=RANKS, timeout=120)
    assert re.findall(r"SEEN (\[[^]]*\] \w+)", again.output) == \
        ["[0, 1, 2, 3, 4] COMMITTED"] * 3, again.output


def test_consistency_mode_and_status_have_rays_values():
    assert [m.name for m in CheckpointConsistencyMode] == ["COMMITTED", "VALIDATED"]
    assert [s.name for s in ReportedCheckpointStatus] == [
        "COMMITTED", "PENDING_VALIDATION", "VALIDATED", "VALIDATION_TIMEOUT", "VALIDATION_FAILED"]


def _torch_names(config: dict) -> dict:
    import torch
    import torch.distributed as dist

    from hpckit.torch import enable_reproducibility, get_devices

    enable_reproducibility(7)
    first = torch.rand(3).tolist()
    enable_reproducibility(7)
    return {"devices": [str(d) for d in get_devices()], "backend": dist.get_backend(),
            "same": first == torch.rand(3).tolist()}


def test_torch_config_get_devices_and_enable_reproducibility(tmp_path):
    import torch

    from hpckit.torch import TorchConfig, TorchTrainer

    try:
        result = TorchTrainer(_torch_names, torch_config=TorchConfig(backend="gloo", timeout_s=60),
                              run_config=RunConfig(name="t", storage_path=str(tmp_path))).fit()
    finally:
        torch.use_deterministic_algorithms(False)
    assert result.return_value == {"devices": ["cpu"], "backend": "gloo", "same": True}
    with pytest.raises(ValueError, match="backend='mpi'"):
        TorchConfig(backend="mpi")
    with pytest.raises(ValueError, match="init_method"):
        TorchConfig(init_method="file")


def test_logging_config_sets_the_level_and_json_lines(tmp_path):
    import json
    import subprocess
    import sys

    program = ("import hpckit\n"
               "from hpckit import DataParallelTrainer, LoggingConfig, RunConfig\n"
               "DataParallelTrainer(lambda: hpckit.report({'loss': 1.0}), run_config=RunConfig(\n"
               f"    name='l', storage_path={str(tmp_path)!r},\n"
               "    logging_config=LoggingConfig(log_level='{level}', encoding='json'))).fit()\n")
    lines = {}
    for level in ("info", "WARNING"):
        out = subprocess.run([sys.executable, "-c", program.replace("{level}", level)],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "HPCKIT_LOG_LEVEL": ""})
        assert out.returncode == 0, out.stderr
        lines[level] = [json.loads(line) for line in out.stderr.splitlines()]
    assert {"time", "level", "rank", "message"} <= set(lines["info"][0])
    assert any(entry["message"].startswith("step 0: loss=1") for entry in lines["info"])
    assert lines["WARNING"] == []
    with pytest.raises(ValueError, match="LOUD"):
        train.LoggingConfig(log_level="LOUD")


def test_user_callbacks_see_every_ranks_metrics_and_each_committed_checkpoint(tmp_path):
    import json

    out = mpiexec(3, "--storage", str(tmp_path), script=HERE / "ranks" / "callbacks.py",
                  timeout=120)
    calls = json.loads(re.search(r"CALLS (.*?) END", out.output).group(1))
    assert [[m["rank"] for m in metrics] for metrics, _ in calls] == [[0, 1, 2]] * 5
    assert [(metrics[0]["step"], checkpoint) for metrics, checkpoint in calls] == [
        (0, "checkpoint_000000"), (1, None), (2, "checkpoint_000001"), (3, None),
        (4, "checkpoint_000002")]


class _Failures(train.UserCallback):
    def __init__(self) -> None:
        self.seen: dict = {}

    def after_exception(self, run_context, worker_exceptions) -> None:
        self.seen = worker_exceptions


def test_user_callbacks_hear_of_a_failure(tmp_path):
    heard = _Failures()
    with pytest.raises(train.TrainingFailedError):
        DataParallelTrainer(_fails, run_config=RunConfig(name="f", storage_path=str(tmp_path),
                                                         callbacks=[heard])).fit()
    assert list(heard.seen) == [0] and isinstance(heard.seen[0], KeyError)
    with pytest.raises(ValueError, match="UserCallback"):
        RunConfig(callbacks=[object()])


class _Raises(train.UserCallback):
    def after_report(self, run_context, metrics, checkpoint) -> None:
        raise RuntimeError("a bug in the callback")


def test_a_failing_callback_is_a_controller_error_and_the_checkpoint_stays_committed(tmp_path):
    trainer = DataParallelTrainer(
        _report_scores, train_loop_config={"metrics": [{"acc": 0.5}, {"acc": 0.6}]},
        run_config=RunConfig(name="c", storage_path=str(tmp_path), callbacks=[_Raises()]))
    with pytest.raises(train.ControllerError, match="a bug in the callback"):
        trainer.fit()
    committed = Result.from_path(tmp_path / "c")
    assert committed.checkpoint.path.endswith("checkpoint_000000")  # the report it was told of


def test_return_value_of_rank_0_reaches_python_train_py(tmp_path):
    import json
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import hpckit\n"
        "from hpckit import DataParallelTrainer, RunConfig, ScalingConfig\n\n"
        "class Model:\n    def __init__(self, rank):\n        self.rank = rank\n\n"
        "def loop():\n    return Model(hpckit.get_context().get_world_rank())\n\n"
        "if __name__ == '__main__':\n"
        "    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),\n"
        f"        run_config=RunConfig(name='r', storage_path={str(tmp_path)!r})).fit()\n"
        "    print('RETURNED', type(result.return_value).__name__, result.return_value.rank)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "RETURNED Model 0" in out.stdout, out.stdout + out.stderr
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["attempts"][0]["status"] \
        == "finished"


def test_get_preemption_info_is_none_until_the_stop_signal_then_the_same_on_every_rank(tmp_path):
    import json
    import socket

    out = mpiexec(3, "--storage", str(tmp_path), "--signal-at", "2", "--steps", "10",
                  "--sleep", "0.05", script=HERE / "ranks" / "preempted.py", expect=75,
                  timeout=120)
    seen = [(int(step), json.loads(info)) for step, info in re.findall(r"INFO (\d+) (.*?) END", out.output)]
    assert sorted(step for step, info in seen if info is None) == [0, 0, 0, 1, 1, 1], out.output
    told = [info for step, info in seen if info is not None]
    assert len(told) == 3 and all(t == told[0] for t in told), out.output  # one answer for all
    assert told[0] == {"deadline_ms": None, "nodes": {socket.gethostname(): [0, 1, 2]},
                       "ranks": [0, 1, 2]}
