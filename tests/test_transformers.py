"""The Transformers Trainer through hpckit.transformers: each save committed by report()
with each rank's own files, the best two kept, and a run stopped by the stop signal resumed
at the step it committed."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import MPIEXEC, checkpoint_dirs, manifest, metrics_lines, run, stopped_after_first_checkpoint

from hpckit.experiment.manifest import is_rank_state
from hpckit.run.writing.writer import state_name

pytest.importorskip("transformers", reason="pip install -e '.[transformers]'")

from hpckit.integrations.transformers import _link_own_files  # noqa: E402

EXAMPLE = Path(__file__).parent.parent / "examples" / "transformers_tiny.py"
QUIET = {"HPCKIT_TENSORBOARD": "0"}
STEPS_PER_EPOCH = 8  # 512 sequences, 32 a batch, on 2 ranks


def example(tmp_path: Path, epochs: int) -> list[str]:
    return [MPIEXEC, "-n", "2", sys.executable, str(EXAMPLE), "--workers", "2", "--epochs",
            str(epochs), "--samples", "512", "--storage", str(tmp_path)]


def test_trainer_checkpoints_are_committed_kept_by_eval_loss_and_resumed(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    first = stopped_after_first_checkpoint(example(tmp_path, epochs=8), pids, QUIET)
    experiment = tmp_path / "transformers-tiny"
    stopped_at = manifest(experiment)["latest"]
    assert f"stopped after committing {experiment / stopped_at}" in first, first
    assert "OMP_NUM_THREADS/MKL_NUM_THREADS unset" not in first, "Accelerate reset the threads"
    resumed = run(example(tmp_path, epochs=8), timeout=180, env=QUIET).output
    assert re.search(rf"resuming experiment \S+ from {stopped_at}", resumed), resumed
    lines = metrics_lines(experiment)
    assert [m["metrics"]["step"] for m in lines] == \
        [STEPS_PER_EPOCH * epoch for epoch in range(1, 9)], "a step was repeated or skipped"
    best = sorted(lines, key=lambda m: m["metrics"]["eval_loss"])[:2]
    assert checkpoint_dirs(experiment) == sorted(m["checkpoint"] for m in best)
    body = manifest(experiment)
    latest = next(c for c in body["checkpoints"] if c["directory"] == body["latest"])
    owners = {f["path"].removeprefix("checkpoint/"): f["rank"] for f in latest["files"]}
    assert owners["rng_state_1.pth"] == 1 and owners["model.safetensors"] == 0, owners
    assert {rank for name, rank in owners.items() if name != "rng_state_1.pth"
            and not is_rank_state(name)} == {0}
    assert owners[state_name(0)] == 0  # hpckit's, exact resume: both ranks', by the node's first
    state = json.loads((experiment / latest["directory"] / "checkpoint" /
                        "trainer_state.json").read_text())
    assert state["global_step"] == 8 * STEPS_PER_EPOCH


def test_under_srun_the_stop_signal_requeues_and_the_job_resumes_at_the_committed_step(tmp_path,
                                                                                      slurm):
    """The example under the user's own sbatch script (a plain srun): Slurm's stop signal
    mid-run commits the next save, hpckit requeues the job, and the requeued job resumes at
    the step it committed and finishes."""
    from support.slurm_jobs import minimal_script, output_of, sbatch, wait, wait_for_reports

    # The signal comes once two epochs are logged and the job stops at its next committed
    # save (epoch 3): the requeued job trains the other three, each step logged once across
    # the requeue. More epochs added seconds of training an epoch and no case.
    epochs = 6
    command = (f"{sys.executable} {EXAMPLE} --workers 2 --epochs {epochs} --samples 512 "
               f"--storage {tmp_path}")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=5", **QUIET)
    experiment = tmp_path / "transformers-tiny"
    wait_for_reports(slurm, tmp_path, experiment, 2, 180)
    slurm.run("scancel", "--signal=USR2", job)
    assert wait(slurm, tmp_path, job, 240) == {job: "COMPLETED"}, output_of(tmp_path)
    attempts = manifest(experiment)["attempts"]
    assert [a["status"] for a in attempts] == ["requeued", "finished"], attempts
    assert {a["launcher"] for a in attempts} == {"srun"}
    assert [m["metrics"]["step"] for m in metrics_lines(experiment)] == \
        [STEPS_PER_EPOCH * epoch for epoch in range(1, epochs + 1)], output_of(tmp_path)


def test_each_rank_hands_in_the_files_it_wrote(tmp_path):
    folder = tmp_path / "checkpoint-8"
    (folder / "sub").mkdir(parents=True)
    for name in ("model.safetensors", "rng_state_0.pth", "rng_state_1.pth", "rng_state_12.pth",
                 "sub/optimizer.pt"):
        (folder / name).write_text(name)
    for rank, expected in ((0, ["model.safetensors", "rng_state_0.pth", "sub/optimizer.pt"]),
                           (1, ["rng_state_1.pth"]), (12, ["rng_state_12.pth"]), (5, [])):
        target = tmp_path / f"rank-{rank}"
        _link_own_files(str(folder), str(target), rank)
        assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == \
            expected


def test_prepare_trainer_refuses_sharded_training_and_says_why(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from hpckit import RunConfig, ScalingConfig
    from hpckit.errors import ConfigError
    from hpckit.torch import TorchTrainer
    from hpckit.transformers import RayTrainReportCallback, prepare_trainer

    def train_func(config: dict) -> None:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=8, n_positions=4, n_embd=8, n_layer=1,
                                           n_head=1))
        plain = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
        trainer = Trainer(model=model, args=plain, callbacks=[RayTrainReportCallback()])
        assert prepare_trainer(trainer) is trainer
        trainer.args.fsdp = "full_shard"
        with pytest.raises(ConfigError, match="not supported yet"):
            prepare_trainer(trainer)

    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=1),
                          run_config=RunConfig(name="prepare", storage_path=str(tmp_path))).fit()
    assert result.error is None
