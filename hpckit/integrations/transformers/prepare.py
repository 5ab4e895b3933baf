"""``prepare_trainer``: a Trainer that would not use hpckit's ranks is refused with the fix."""

from __future__ import annotations

from transformers import Trainer

import hpckit
from hpckit.errors import ConfigError
from hpckit.integrations.transformers.callback import RayTrainReportCallback
from hpckit.logs import log


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
