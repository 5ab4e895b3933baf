"""Lightning's checkpoints, committed through ``hpckit.report()``."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

import hpckit
from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError
from hpckit.writes import claim


class RayTrainReportCallback(Callback):
    """Saves the Lightning checkpoint (``checkpoint.ckpt``, written as the strategy writes it:
    by rank 0 for DDP) into this report's checkpoint directory and reports it with the
    metrics Lightning logged, plus ``epoch`` and ``step``.

    By default at the end of every training epoch, after validation, as Ray's callback does;
    ``every_n_epochs`` and ``every_n_train_steps`` change that. Every rank runs the same
    hooks, so every rank reports the same number of times. Resume with
    ``trainer.fit(model, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))``
    where ``d`` is ``hpckit.get_checkpoint()``'s directory: Lightning restores the epoch, the
    global step, the optimizers and the loops.

    Args:
        every_n_epochs: Report at the end of every this many training epochs, after
            validation (a whole number >= 0; 1, the default, every epoch; 0 never).
            hpckit's own (Ray: every epoch).
        every_n_train_steps: Also report after every this many optimizer steps (a whole
            number >= 0); None or 0 (the default) never. A step that ends an epoch that
            reports is reported once, after validation. hpckit's own.

    Raises:
        ConfigError: A value is not a whole number >= 0.
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, every_n_epochs: int = 1, every_n_train_steps: int | None = None) -> None:
        super().__init__()
        for name, value in (("every_n_epochs", every_n_epochs),
                            ("every_n_train_steps", every_n_train_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ConfigError(f"RayTrainReportCallback({name}={value!r}) must be a whole "
                                  "number >= 0 (0 turns that trigger off)")
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps or 0
        self._last_step: int | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        steps = self.every_n_train_steps
        if steps and trainer.global_step % steps == 0 and not (
                trainer.is_last_batch and self._epoch_due(trainer)):
            self._report(trainer)  # at an epoch's last batch, the epoch's report, after validation

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._epoch_due(trainer):
            self._report(trainer)

    def _epoch_due(self, trainer: pl.Trainer) -> bool:
        epochs = self.every_n_epochs
        return bool(epochs) and (trainer.current_epoch + 1) % epochs == 0

    def _report(self, trainer: pl.Trainer) -> None:
        if trainer.sanity_checking or self._last_step == trainer.global_step:
            return  # nothing trained since the last report (gradient accumulation, epoch end)
        self._last_step = trainer.global_step
        metrics = {name: _value(value) for name, value in trainer.callback_metrics.items()}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        directory = hpckit.get_context().get_checkpoint_dir()
        path = os.path.join(directory, self.CHECKPOINT_NAME)
        trainer.save_checkpoint(path)
        if trainer.is_global_zero and os.path.isfile(path):  # one file, rank 0's (DDP)
            claim(directory, self.CHECKPOINT_NAME)
        hpckit.report(metrics, checkpoint=Checkpoint.from_directory(directory))


def _value(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value
