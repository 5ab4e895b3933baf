"""The Trainer's checkpoints, committed through ``hpckit.report()``."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import hpckit
from hpckit.checkpoint import Checkpoint

RNG_STATE = re.compile(r"rng_state_(\d+)\.pth")


class RayTrainReportCallback(TrainerCallback):
    """At each save of the Trainer, reports the checkpoint folder it has just written
    (``{output_dir}/checkpoint-{step}``) as ``checkpoint/`` with the metrics it logged so
    far (the latest value of each, with ``step`` and ``epoch``).

    Each rank hands in the files it wrote: ``rng_state_{rank}.pth`` is that rank's, every
    other file the main process's (rank 0), so ``output_dir`` may be shared by the ranks or
    local to each node. Every rank saves at the same steps, so every rank reports the same
    number of times. Resume with ``trainer.train(resume_from_checkpoint=os.path.join(d,
    RayTrainReportCallback.CHECKPOINT_NAME))`` where ``d`` is ``hpckit.get_checkpoint()``'s
    directory: the Trainer restores the model, optimizer, scheduler, step and RNG states."""

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        output = args.output_dir or "trainer_output"  # as TrainingArguments fills it in
        folder = os.path.join(output, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        metrics: dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        metrics.update(step=state.global_step, epoch=state.epoch)
        rank = hpckit.get_context().get_world_rank()
        with tempfile.TemporaryDirectory(prefix="hpckit-transformers-") as handed:
            _link_own_files(folder, os.path.join(handed, self.CHECKPOINT_NAME), rank)
            hpckit.report(metrics, checkpoint=Checkpoint.from_directory(handed))


def _link_own_files(folder: str, target: str, rank: int) -> None:
    """The files of ``folder`` that ``rank`` wrote, linked (copied across filesystems)."""
    os.makedirs(target)
    for parent, _, names in os.walk(folder):
        for name in names:
            writer = RNG_STATE.fullmatch(name)
            if (int(writer.group(1)) if writer else 0) != rank:
                continue
            source = os.path.join(parent, name)
            destination = os.path.join(target, os.path.relpath(source, folder))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            try:
                os.link(source, destination)
            except OSError:
                shutil.copy2(source, destination)
