"""PyTorch Lightning through hpckit.lightning: checkpoints committed by report(), the best
two kept, and a resumed run that continues at the next epoch and global step."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import MPIEXEC, checkpoint_dirs, manifest, metrics_lines, run, stopped_after_first_checkpoint

from hpckit.experiment.manifest import is_rank_state
from hpckit.run.writing.writer import state_name

pl = pytest.importorskip("lightning.pytorch", reason="pip install -e '.[lightning]'")

from hpckit import Result, RunConfig, ScalingConfig  # noqa: E402
from hpckit.errors import ConfigError  # noqa: E402
from hpckit.lightning import (  # noqa: E402
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from hpckit.torch import TorchTrainer  # noqa: E402

EXAMPLE = Path(__file__).parent.parent / "examples" / "lightning_mnist_like.py"
QUIET = {"HPCKIT_TENSORBOARD": "0"}


def example(ranks: int, tmp_path: Path, epochs: int, launcher: list[str]) -> list[str]:
    return [*launcher, sys.executable, str(EXAMPLE), "--workers", str(ranks), "--epochs",
            str(epochs), "--samples", "1024", "--storage", str(tmp_path), "--data",
            str(tmp_path / "fashion.h5")]


def test_lightning_stops_keeps_the_best_two_and_resumes_at_the_next_epoch_and_step(tmp_path):
    """Stopped (the stop signal) after its first checkpoint, a 2-rank run under mpiexec
    commits the next one and exits 75; ``python example.py --workers 3`` (hpckit starts the
    ranks) resumes it at the next epoch and global step."""
    pids = tmp_path / "pids"
    pids.mkdir()
    first = stopped_after_first_checkpoint(example(2, tmp_path, 3, [MPIEXEC, "-n", "2"]), pids,
                                           QUIET)
    assert "stopped after committing" in first and "checkpoint_000001" in first, first
    if shutil.which("srun"):  # Lightning's hint to "prepend srun" is wrong under mpiexec
        assert "prepend your python command with `srun`" not in first, first
    experiment = tmp_path / "lightning-mnist-like"
    resumed = run(example(3, tmp_path, 3, []), timeout=180, env=QUIET).output
    assert resumed.count("val_loss ") == 1, resumed  # the Result, printed once
    assert re.search(r"Restored all states from the checkpoint at \S+/checkpoint_000001/"
                     r"checkpoint\.ckpt", resumed), resumed
    lines = metrics_lines(experiment)
    # 1024 images: 8 steps an epoch on 2 ranks, then 6 (1024 / 3 / 64, rounded up) on 3.
    assert [(m["metrics"]["epoch"], m["metrics"]["step"]) for m in lines] == \
        [(0, 8), (1, 16), (2, 22)]
    body = manifest(experiment)
    by_loss = sorted(lines, key=lambda m: m["metrics"]["val_loss"])[:2]
    assert checkpoint_dirs(experiment) == sorted(m["checkpoint"] for m in by_loss)
    for entry in body["checkpoints"]:
        states = [f for f in entry["files"] if is_rank_state(f["path"])]  # the node's ranks'
        assert [(f["path"], f["rank"]) for f in states] == [(state_name(0), 0)]
        assert [(f["path"], f["rank"]) for f in entry["files"] if f not in states] == [
            ("checkpoint.ckpt", 0)]
    assert body["latest"] == "checkpoint_000002"


def test_prepare_trainer_says_what_to_change(tmp_path):
    def train_func(config: dict) -> None:
        quiet = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
        for options, fix in ((dict(strategy="ddp"), "strategy is DDPStrategy"),
                             (dict(strategy=RayDDPStrategy()), "cluster environment is "
                                                                 "LightningEnvironment")):
            with pytest.raises(ConfigError, match=fix) as raised:
                prepare_trainer(pl.Trainer(**quiet, **options))
            assert "plugins=[RayLightningEnvironment()]" in str(raised.value)
        good = pl.Trainer(**quiet, strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()])
        assert prepare_trainer(good) is good
        assert good.world_size == 1 and good.global_rank == 0

    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=1),
                          run_config=RunConfig(name="prepare", storage_path=str(tmp_path))).fit()
    assert isinstance(result, Result) and result.error is None


@pytest.mark.parametrize("options", [dict(every_n_epochs=-1), dict(every_n_train_steps=1.5),
                                     dict(every_n_epochs=True)])
def test_report_callback_refuses_bad_intervals(options):
    with pytest.raises(ConfigError, match=next(iter(options))):
        RayTrainReportCallback(**options)


def test_the_ray_names_are_all_there():
    import hpckit.lightning

    assert sorted(hpckit.lightning.__all__) == sorted(
        ["RayDDPStrategy", "RayFSDPStrategy", "RayLightningEnvironment",
         "RayTrainReportCallback", "prepare_trainer"])
    assert json.dumps(RayTrainReportCallback.CHECKPOINT_NAME) == '"checkpoint.ckpt"'


def test_under_srun_lightning_takes_hpckit_ranks_and_not_slurm_environment(tmp_path, slurm):
    """The example under the user's own sbatch script (a plain srun): Lightning uses the two
    ranks srun started (each trains on half the data) and commits."""
    from support.slurm_jobs import minimal_script, output_of, sbatch, wait

    command = " ".join(example(2, tmp_path, 2, []))
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=5", **QUIET)
    assert wait(slurm, tmp_path, job, 180) == {job: "COMPLETED"}, output_of(tmp_path)
    body = manifest(tmp_path / "lightning-mnist-like")
    assert [(a["status"], a["launcher"], a["world_size"]) for a in body["attempts"]] == \
        [("finished", "srun", 2)]
    assert [m["metrics"]["step"] for m in metrics_lines(tmp_path / "lightning-mnist-like")] == \
        [8, 16]


@pytest.mark.parametrize("options,steps", [
    (dict(every_n_epochs=0, every_n_train_steps=3), [3, 6, 9, 12, 15]),
    (dict(every_n_train_steps=4), [4, 8, 12, 16]),
    (dict(every_n_epochs=2), [16])])
def test_report_callback_reports_every_n_steps_or_epochs_once_per_step(tmp_path, options, steps):
    """8 steps an epoch, 2 epochs, one rank in this process: steps 8 and 16 are both step
    and epoch triggers, and are reported once, after the epoch's validation."""
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, _):  # type: ignore[no-untyped-def]
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, _):  # type: ignore[no-untyped-def]
            self.log("val_loss", self.layer(batch[0]).pow(2).mean())

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_func(config: dict) -> None:
        data = torch.utils.data.TensorDataset(torch.randn(64, 2))
        trainer = prepare_trainer(pl.Trainer(
            max_epochs=2, accelerator="cpu",
            logger=False, enable_progress_bar=False, enable_checkpointing=False,
            strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback(**options)]))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        trainer.fit(Tiny(), loader, torch.utils.data.DataLoader(data, batch_size=32))

    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=1),
                          run_config=RunConfig(name="steps", storage_path=str(tmp_path))).fit()
    assert result.error is None
    lines = metrics_lines(tmp_path / "steps")
    assert [m["metrics"]["step"] for m in lines] == steps
    for m in lines:  # an epoch's end is reported after its validation
        assert ("val_loss" in m["metrics"]) == (m["metrics"]["step"] >= 8), m
