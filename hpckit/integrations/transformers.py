"""Hugging Face Transformers' ``Trainer`` on hpckit's ranks, as Ray Train's
``ray.train.huggingface.transformers`` offers it: the report callback, which commits the
Trainer's checkpoints through ``hpckit.report()``, and ``prepare_trainer``, which refuses a
Trainer that would not use hpckit's ranks, with the fix. Public names in
:mod:`hpckit.transformers`; the ``transformers`` package is an optional extra (``pip install
-e '.[transformers]'`` in hpckit's clone) that only this module imports."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import hpckit
from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError
from hpckit.logs import log

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


def prepare_trainer(trainer: Trainer) -> Trainer:
    """Check that ``trainer`` trains data-parallel over hpckit's ranks and reports its
    checkpoints, and return it.

    Ray's also wraps Ray Data iterators, which hpckit has not; this one only checks. Call
    it inside the training function, on every rank.

    Args:
        trainer: A ``transformers.Trainer`` whose ``TrainingArguments`` were made inside the
            training function, with a :class:`RayTrainReportCallback` among its callbacks
            (without one, rank 0 warns that nothing reaches hpckit).

    Returns:
        ``trainer`` itself.

    Raises:
        ConfigError: The Trainer sees another world size than hpckit's ranks, or uses
            DeepSpeed or FSDP (not supported yet).
        HpckitError: Called outside a training run.
    """
    context = hpckit.get_context()
    world, seen = context.get_world_size(), trainer.args.world_size
    if seen != world:
        raise ConfigError(
            f"the Trainer sees {seen} process(es) but hpckit runs {world} rank(s): create the "
            "TrainingArguments inside the training function that TorchTrainer runs (hpckit sets "
            "RANK, WORLD_SIZE and LOCAL_RANK there), with no DeepSpeed or FSDP options")
    if trainer.args.deepspeed or trainer.args.fsdp:
        raise ConfigError("TrainingArguments(deepspeed=...) and (fsdp=...) are not supported yet: "
                          "each rank would write shards that RayTrainReportCallback does not "
                          "hand in; train with DDP (neither option)")
    reporting = any(isinstance(c, RayTrainReportCallback)
                    for c in trainer.callback_handler.callbacks)
    if not reporting and context.get_world_rank() == 0:
        log.warning("the Trainer has no RayTrainReportCallback: its checkpoints and metrics will "
                    "not reach hpckit; trainer.add_callback(RayTrainReportCallback())")
    elif trainer.args.save_strategy == "no" and context.get_world_rank() == 0:
        log.warning("TrainingArguments(save_strategy='no'): the Trainer never saves, so nothing "
                    "is reported; use save_strategy='epoch' or 'steps'")
    return trainer
