"""Ray Tune's checkpoint guide as written (tests/seeds/tune_guide*.py: only the import
changed): tune.run with tune.SyncConfig on a shared directory, on S3 and with a syncer; the
function API (checkpoint_dir, keyword reports) and the class API (tune.Trainable); each killed
mid-run and run again; bad arguments refused before anything starts."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pyarrow.fs
import pytest
from conftest import HERE, MPIEXEC, manifest, metrics_lines, run

from hpckit import CheckpointConfig, tune
from hpckit import SyncConfig as RunSyncConfig
from hpckit.errors import ConfigError

GUIDE = HERE / "seeds" / "tune_guide.py"
CLASS = HERE / "seeds" / "tune_guide_class.py"
QUICK = {"HPCKIT_TENSORBOARD": "0"}
STEPS = 8
LRS = (0.1, 0.2, 0.3)


def auc(step: int, lr: float) -> float:
    return 0.5 + 0.4 * math.sin(1.3 * step + lr)


def analysis(output: str) -> dict:
    """The first ANALYSIS line (every rank prints one; two may share an output line)."""
    found = output.find("ANALYSIS {")
    assert found >= 0, output
    return json.JSONDecoder().raw_decode(output, found + len("ANALYSIS "))[0]


def killed_then_rerun(command: list[str], env: dict[str, str]) -> str:
    """The run SIGKILLed with every rank after rank 0's third commit, then run again."""
    first = run(command, timeout=120, env={**env, "HPCKIT_FAULT": "committed:0:3:all"},
                expect=None)
    assert first.returncode != 0 and "ANALYSIS" not in first.output, first.output
    return run(command, timeout=180, env=env).output


def check_trial(steps_of: list[int], kept: list[str], lr: float, output: str) -> None:
    """Each step once; the best five by auc and the latest kept, named checkpoint_<step>."""
    assert steps_of == list(range(STEPS)), f"lr={lr}: steps {steps_of}\n{output}"
    best = sorted(range(STEPS), key=lambda s: auc(s, lr), reverse=True)[:5]
    assert sorted(kept) == sorted({f"checkpoint_{s}" for s in [*best, STEPS - 1]}), \
        f"lr={lr}: kept {kept}\n{output}"


def test_the_guide_on_a_shared_directory_resumes_each_trial_after_sigkill(tmp_path):
    env = {**QUICK, "LOCAL_DIR": str(tmp_path), "SYNCER": "none", "STEP_SECONDS": "0.1"}
    output = killed_then_rerun([MPIEXEC, "-n", "2", sys.executable, str(GUIDE)], env)
    assert "RESUMED" in output, output
    experiment = tmp_path / "my-tune-exp"
    trials = sorted(p for p in experiment.iterdir() if p.is_dir())
    assert [t.name for t in trials] == [f"trial_0000{i}_lr={lr}" for i, lr in enumerate(LRS)]
    for trial, lr in zip(trials, LRS, strict=True):
        check_trial([m["metrics"]["step"] for m in metrics_lines(trial)],
                    [p.name for p in trial.glob("checkpoint_*")], lr, output)
        assert (trial / "checkpoint_7" / "checkpoint").read_text() == '{"step": 7}'
    found = analysis(output)
    best_lr = max(LRS, key=lambda lr: auc(STEPS - 1, lr))
    assert found["best_config"] == found["best_trial_config"] == {"lr": best_lr}
    assert found["statuses"] == ["TERMINATED"] * 3 and found["rows"] == 3
    assert len(found["kept"]) == 5 and found["best_checkpoint"] in found["kept"]
    assert "deprecated: tune.run(local_dir=...) -> RunConfig(storage_path=...)" in output


def test_the_guide_s3_example_keeps_everything_at_upload_dir_and_resumes(tmp_path, s3):
    prefix = f"guide-{tmp_path.name}/path"
    env = {**QUICK, "LOCAL_DIR": str(tmp_path / "staging"), "UPLOAD": s3.uri(prefix + "/"),
           "SYNCER": "auto", "STEP_SECONDS": "0.1"}
    output = killed_then_rerun([MPIEXEC, "-n", "2", sys.executable, str(GUIDE)], env)
    assert "RESUMED" in output, output
    fs = s3.filesystem()
    root = f"{s3_bucket(s3)}/{prefix}/my-tune-exp"
    for index, lr in enumerate(LRS):
        trial = f"{root}/trial_0000{index}_lr={lr}"
        lines = [json.loads(line) for line in s3.read_text(
            f"{prefix}/my-tune-exp/trial_0000{index}_lr={lr}/metrics.jsonl").splitlines()]
        kept = [info.base_name for info in fs.get_file_info(pyarrow.fs.FileSelector(trial))
                if info.base_name.startswith("checkpoint_")]
        check_trial([m["metrics"]["step"] for m in lines], kept, lr, output)
    assert not (tmp_path / "staging" / "my-tune-exp").exists(), "local_dir is only staging"


def s3_bucket(s3) -> str:
    return s3.uri().split("@", 1)[1].split("/", 1)[0]


@pytest.mark.parametrize("syncer", ["command", "callable"])
def test_a_syncer_command_or_function_copies_every_trial_to_upload_dir(tmp_path, syncer):
    upload = tmp_path / "upload"
    env = {**QUICK, "LOCAL_DIR": str(tmp_path / "local"), "UPLOAD": str(upload),
           "SYNCER": syncer, "STEPS": "3"}
    run([sys.executable, str(GUIDE)], timeout=120, env=env)
    for index, lr in enumerate(LRS):
        name = f"my-tune-exp/trial_0000{index}_lr={lr}"
        local, copied = tmp_path / "local" / name, upload / name
        assert manifest(copied) == manifest(local)
        assert sorted(p.name for p in copied.glob("checkpoint_*")) == \
            ["checkpoint_0", "checkpoint_1", "checkpoint_2"]


def test_the_class_api_checkpoints_every_second_iteration_and_at_the_end(tmp_path):
    env = {**QUICK, "LOCAL_DIR": str(tmp_path)}
    first = run([sys.executable, str(CLASS)], timeout=120, env={
        **env, "HPCKIT_FAULT": "committed:0:2:all"}, expect=None)
    assert first.returncode != 0 and "LAST" not in first.output, first.output
    output = run([sys.executable, str(CLASS)], timeout=120, env=env).output
    assert "LOADED lr=1 x=4 iteration=4" in output, "load_checkpoint got the path it saved"
    assert "LAST [5, 10]" in output
    for trial in sorted((tmp_path / "class-exp").glob("trial_*")):
        assert [m["metrics"]["training_iteration"] for m in metrics_lines(trial)] == [1, 2, 3, 4, 5]
        saved = [c["metrics"]["training_iteration"] for c in manifest(trial)["checkpoints"]]
        assert saved == [2, 4, 5], saved


def test_the_class_api_runs_through_the_tuner_with_its_checkpoint_config(tmp_path):
    program = f"""
import sys
sys.path.insert(0, {str(CLASS.parent)!r})
from tune_guide_class import MyTrainableClass
from hpckit import tune, CheckpointConfig, RunConfig
grid = tune.Tuner(MyTrainableClass, param_space={{"lr": tune.grid_search([3])}},
                  run_config=RunConfig(name="tuner", storage_path={str(tmp_path)!r},
                                       stop={{"training_iteration": 3}},
                                       checkpoint_config=CheckpointConfig(
                                           checkpoint_frequency=2, checkpoint_at_end=True))).fit()
print("SCORE", grid[0].metrics["score"])
"""
    assert "SCORE 9" in run([sys.executable, "-c", program], timeout=120, env=QUICK).output
    trial = next((tmp_path / "tuner").glob("trial_*"))
    assert [c["metrics"]["training_iteration"] for c in manifest(trial)["checkpoints"]] == [2, 3]


def test_restore_starts_every_trial_of_a_new_experiment_from_a_checkpoint(tmp_path):
    run([sys.executable, str(GUIDE)], timeout=120,
        env={**QUICK, "LOCAL_DIR": str(tmp_path), "SYNCER": "none", "STEPS": "4"})
    start = tmp_path / "my-tune-exp" / "trial_00000_lr=0.1" / "checkpoint_2"
    program = f"""
import sys
sys.path.insert(0, {str(GUIDE.parent)!r})
from tune_guide import my_trainable
from hpckit import tune
tune.run(my_trainable, name="restored", config={{"lr": 0.5}}, storage_path={str(tmp_path)!r},
         restore={str(start)!r})
"""
    output = run([sys.executable, "-c", program], timeout=120, env={**QUICK, "STEPS": "5"}).output
    assert "RESUMED lr=0.5 at step 3" in output, output
    trial = next((tmp_path / "restored").glob("trial_*"))
    assert [m["metrics"]["step"] for m in metrics_lines(trial)] == [3, 4]


def my_trainable(config, checkpoint_dir=None):
    raise AssertionError("a refused tune.run must not start a trial")


@pytest.mark.parametrize("arguments,words", [
    ({"checkpoint_score_attr": "avg-auc"}, "use 'max-auc' or 'min-auc'"),
    ({"resume": "SOMETIMES"}, "tune.run(resume='SOMETIMES') is invalid"),
    ({"scheduler": object()}, "TuneConfig(scheduler=<object"),
    ({"resources_per_trial": {"cpu": 2}}, "tune.run(resources_per_trial=...) is not supported"),
    ({"checkpoint_freq": 2}, "needs a tune.Trainable class"),
    ({"sync_config": RunSyncConfig()}, "takes tune.SyncConfig(upload_dir=..., syncer=...)"),
    ({"stop": "soon"}, "RunConfig(stop="),
])
def test_bad_arguments_are_refused_before_any_trial_starts(tmp_path, arguments, words):
    with pytest.raises(ConfigError) as raised:
        tune.run(my_trainable, local_dir=str(tmp_path), **arguments)
    assert words in str(raised.value)
    assert not any(tmp_path.iterdir()), "something was written"


def test_a_syncer_command_without_target_is_refused():
    with pytest.raises(ConfigError, match=re.escape("{source} and {target}")):
        tune.SyncConfig(upload_dir="s3://bucket/path", syncer="aws s3 sync {source} s3://x")
    assert CheckpointConfig(checkpoint_frequency=2).checkpoint_frequency == 2


def test_a_rerun_with_resume_false_is_refused_naming_the_fix(tmp_path):
    run([sys.executable, str(GUIDE)], timeout=120,
        env={**QUICK, "LOCAL_DIR": str(tmp_path), "SYNCER": "none", "STEPS": "1"})
    with pytest.raises(ConfigError, match="pass resume='AUTO' to continue it"):
        tune.run(my_trainable, name="my-tune-exp", local_dir=str(tmp_path), resume=False)
    assert Path(tmp_path / "my-tune-exp" / "sweep.json").exists()
