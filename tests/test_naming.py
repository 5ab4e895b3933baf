"""Default experiment names, and what a run says about resuming: running the same command
again resumes only when the name is fixed, so a run under a name made from the time says how
to resume instead, and warns when it may have been meant to continue an earlier experiment."""

from __future__ import annotations

import pytest

from hpckit.experiment import encoding
from hpckit.config import RunConfig, ScalingConfig
from hpckit.experiment.attempts import Attempt, AttemptStatus
from hpckit.experiment.manifest import MANIFEST_NAME, CheckpointRecord, Manifest
from hpckit.run.ending.stop import how_to_resume, interrupted_line
from hpckit.run.job import Backend, TrainingJob, meant_to_resume
from hpckit.settings import Settings
from hpckit.storage.location import local

pytestmark = pytest.mark.quick


def _loop() -> None:
    pass


def _job(name: str | None = None) -> TrainingJob:
    return TrainingJob(_loop, None, ScalingConfig(num_workers=1), RunConfig(name=name), None,
                       Backend())


@pytest.mark.parametrize("settings,name,timestamped", [
    (Settings(), None, True),
    (Settings(), "resnet", False),
    (Settings(name="resnet"), None, False),  # $HPCKIT_NAME, as hpckit resume sets it
    (Settings(slurm_job_id="42"), None, False),
    (Settings(slurm_job_id="43", slurm_array_job_id="42", slurm_array_task_id="1"), None, False),
])
def test_only_a_name_made_from_the_time_is_timestamped(settings, name, timestamped):
    job = _job(name).named(settings)
    assert job.timestamped is timestamped
    assert ("run the same command again" in job.resume_hint(settings)) is not timestamped


def test_how_to_resume_names_the_experiment_either_way():
    fixed = how_to_resume("/runs/resnet", rerun_resumes=True)
    assert fixed == "run the same command again, or: hpckit resume /runs/resnet"
    made = how_to_resume("s3://b/runs/train-20250101-120000?region=x", rerun_resumes=False)
    assert "hpckit resume s3://b/runs/train-20250101-120000?region=x" in made
    assert "RunConfig(name='train-20250101-120000')" in made
    assert "run the same command again" not in made
    line = interrupted_line(local("/runs/resnet"), None, rerun_resumes=True)
    assert line.startswith("interrupted; no checkpoint was committed. To resume, run the same")


def _experiment(root, name: str, status: AttemptStatus, checkpoints: int = 1) -> None:
    records = tuple(CheckpointRecord(i, f"checkpoint_{i:06d}", i, 1.0, {}, ())
                    for i in range(checkpoints))
    manifest = Manifest(name, 1, {}, {}, {}, 1.0, records, checkpoints, checkpoints,
                        (Attempt(0, status, 1.0),))
    (root / name).mkdir()
    (root / name / MANIFEST_NAME).write_text(encoding.to_json(manifest))


NOW = "train-20250102-090000"


@pytest.mark.parametrize("status", [AttemptStatus.INTERRUPTED, AttemptStatus.FAILED,
                                    AttemptStatus.STOPPED, AttemptStatus.HUNG])
def test_a_new_timestamped_run_names_the_unfinished_one_before_it(tmp_path, status):
    _experiment(tmp_path, "train-20250101-080000", AttemptStatus.INTERRUPTED)
    _experiment(tmp_path, "train-20250101-120000", status, checkpoints=3)
    _experiment(tmp_path, NOW, AttemptStatus.RUNNING, checkpoints=0)
    warning = meant_to_resume(local(str(tmp_path)), NOW)
    assert warning is not None
    assert f"hpckit resume {tmp_path / 'train-20250101-120000'}" in warning
    assert "RunConfig(name='train-20250101-120000')" in warning
    assert f"({status.value}, with checkpoint_000002 committed)" in warning


@pytest.mark.parametrize("earlier,status,checkpoints", [
    ("train-20250101-120000", AttemptStatus.FINISHED, 1),
    ("train-20250101-120000", AttemptStatus.RUNNING, 1),  # perhaps another live run
    ("train-20250101-120000", AttemptStatus.INTERRUPTED, 0),  # nothing to resume from
    ("eval-20250101-120000", AttemptStatus.INTERRUPTED, 1),  # another script
    ("train-20250103-120000", AttemptStatus.INTERRUPTED, 1),  # a later one
    ("train-old", AttemptStatus.INTERRUPTED, 1),  # a name the user chose
])
def test_no_warning_without_an_unfinished_experiment_just_before(tmp_path, earlier, status,
                                                                 checkpoints):
    _experiment(tmp_path, "train-20241231-235959", AttemptStatus.FINISHED)
    _experiment(tmp_path, earlier, status, checkpoints)
    assert meant_to_resume(local(str(tmp_path)), NOW) is None
