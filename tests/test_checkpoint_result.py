"""Checkpoint and Result on a local filesystem (single rank, in this process)."""

from __future__ import annotations

import os
import tempfile

import pytest

import hpckit
from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, Result, RunConfig
from hpckit.errors import ManifestError
from hpckit.torch import TorchTrainer


def test_checkpoint_directory_metadata_and_copies(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"abc")
    ckpt = Checkpoint.from_directory(src)
    assert repr(ckpt) == f"Checkpoint(filesystem=local, path={src})"
    with ckpt.as_directory() as d:
        assert d == str(src)  # local: no copy
    ckpt.set_metadata({"epoch": 3})
    ckpt.update_metadata({"lr": 0.1})
    assert ckpt.get_metadata() == {"epoch": 3, "lr": 0.1}
    copy = ckpt.to_directory(tmp_path / "copy")
    assert (tmp_path / "copy" / "sub" / "w.bin").read_bytes() == b"abc" and copy == str(tmp_path / "copy")
    assert Checkpoint(f"file://{src}") == ckpt


def loop(config):
    for epoch, acc in enumerate(config["accs"]):
        d = os.path.join(config["tmp"], f"e{epoch}")
        os.makedirs(d)
        with open(os.path.join(d, "m.txt"), "w") as f:
            f.write(str(epoch))
        hpckit.report({"acc": acc, "loss": 1 - acc, "epoch": epoch},
                      checkpoint=Checkpoint.from_directory(d))


def test_result_from_fit_and_from_path_agree(tmp_path):
    trainer = TorchTrainer(loop, train_loop_config={"accs": [0.2, 0.9, 0.5, 0.1], "tmp": str(tmp_path)},
                           run_config=RunConfig(name="r", storage_path=str(tmp_path / "s"),
                                                checkpoint_config=CheckpointConfig(
                                                    num_to_keep=2, checkpoint_score_attribute="acc")))
    result = trainer.fit()
    exp = tmp_path / "s" / "r"
    assert result.path == str(exp) and result.error is None
    assert result.metrics == {"acc": 0.1, "loss": 0.9, "epoch": 3}
    assert result.checkpoint.path == str(exp / "checkpoint_000003")
    # As in Ray: worst to best, at most num_to_keep (the latest is kept on storage, not listed).
    assert [c.path for c, _ in result.best_checkpoints] == [
        str(exp / "checkpoint_000002"), str(exp / "checkpoint_000001")]
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2, 3]
    again = Result.from_path(exp)
    assert again.metrics == result.metrics and again.checkpoint == result.checkpoint
    assert [c for c, _ in again.best_checkpoints] == [c for c, _ in result.best_checkpoints]
    assert again.get_best_checkpoint("loss", "min").path == str(exp / "checkpoint_000001")
    with again.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "m.txt")).read() == "3"


def test_result_from_a_path_that_is_not_an_experiment(tmp_path):
    with pytest.raises(ManifestError, match="not an hpckit experiment"):
        Result.from_path(tmp_path)


def _named_once(config: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        hpckit.report({"epoch": 0}, checkpoint=Checkpoint.from_directory(d),
                      checkpoint_dir_name="model")


def test_an_empty_directory_left_by_a_run_killed_before_its_pending_marker_is_taken(tmp_path):
    """Killed between making a reserved directory and marking it pending, a run leaves an
    empty directory (an S3 directory marker) that no leftover check recognises."""
    (tmp_path / "left" / "model").mkdir(parents=True)
    result = DataParallelTrainer(_named_once, run_config=RunConfig(
        name="left", storage_path=str(tmp_path))).fit()
    assert result.checkpoint.path == str(tmp_path / "left" / "model")
    (tmp_path / "full" / "model").mkdir(parents=True)
    (tmp_path / "full" / "model" / "mine.txt").write_text("keep")
    with pytest.raises(hpckit.TrainingFailedError, match="already exists"):
        DataParallelTrainer(_named_once, run_config=RunConfig(
            name="full", storage_path=str(tmp_path))).fit()
    assert (tmp_path / "full" / "model" / "mine.txt").read_text() == "keep"


def _same_name_twice(config: dict) -> None:
    for epoch in range(2):
        with tempfile.TemporaryDirectory() as d:
            hpckit.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(d),
                          checkpoint_dir_name="model")


def test_two_reports_with_the_same_checkpoint_dir_name_fail_clearly_keeping_the_first(tmp_path):
    trainer = DataParallelTrainer(_same_name_twice,
                                  run_config=RunConfig(name="same", storage_path=str(tmp_path)))
    with pytest.raises(hpckit.TrainingFailedError) as caught:
        trainer.fit()
    failure = caught.value.worker_failures[0]
    assert isinstance(failure, hpckit.CheckpointError), failure
    assert f"report(checkpoint_dir_name='model'): {tmp_path / 'same' / 'model'} already exists" \
        in str(failure), failure
    result = Result.from_path(tmp_path / "same")
    assert result.checkpoint.path == str(tmp_path / "same" / "model")
    assert [c.path for c, _ in result.best_checkpoints] == [result.checkpoint.path]
