"""torch.distributed.checkpoint (DCP) straight into the pending checkpoint.

Every rank saves its own shards in parallel (FSDP2 and DTensor state included) into
``get_context().get_checkpoint_dir()``; ``report()`` then commits what they wrote without a
copy. Loading goes through DCP's planner, so a run resumed with another world size reshards.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from hpckit.checkpoint import Checkpoint, written_when
from hpckit.errors import CheckpointError
from hpckit.integrations.torch.save import PendingWrite
from hpckit.run.session.session import get_checkpoint, get_context

__all__ = ["load_state_dcp", "save_state_dcp"]

_cpu_group: Any = None
_pinned_stager: DefaultStager | None = None
_previous: PendingWrite | None = None  # the last asynchronous save's write


def save_state_dcp(state_dict: dict[str, Any], *, async_: bool = False,
                   process_group: Any = None) -> Checkpoint:
    """Save ``state_dict`` with DCP into this report's pending checkpoint; collective.

    Returns the checkpoint to hand to ``hpckit.report()`` on every rank. With ``async_`` the
    state is staged into host memory (pinned and reused between saves for CUDA tensors) before
    this returns, so training may change it at once; the files are written by DCP's thread,
    and ``report(..., checkpoint_upload_mode="async")`` waits for them in the background.
    hpckit's own (Ray has no such call).

    Args:
        state_dict: What ``dcp.save`` takes: a dict of tensors, DTensors (FSDP2's shards)
            and objects with ``state_dict()``, such as
            ``torch.distributed.checkpoint.state_dict.get_state_dict``'s.
        async_: Save with ``dcp.async_save`` and return once the state is staged; False (the
            default) returns once the files are written.
        process_group: The group that saves, as DCP takes it; None (the default) is the
            default group, or for an asynchronous save a Gloo group of its own made once,
            so that its collectives do not interleave with training's.

    Returns:
        The pending checkpoint, to pass to ``hpckit.report()``.

    Raises:
        CheckpointError: The previous asynchronous save failed where no report took it.
        HpckitError: Called outside a training run.
    """
    context = get_context()
    directory = context.get_checkpoint_dir()
    checkpoint = Checkpoint.from_directory(directory)
    global _previous
    if _previous is not None:
        # Two saves at once would interleave their collectives on one group; an error that no
        # report took is this save's to raise.
        _previous.raise_untold(context, "the next save_state_dcp")
    if not async_:
        dcp.save(state_dict, checkpoint_id=directory, process_group=process_group)
        return checkpoint
    group = process_group if process_group is not None else _group_for_async()
    saving = dcp.async_save(state_dict, checkpoint_id=directory, process_group=group,
                            async_stager=_stager(state_dict))
    rank = context.get_world_rank()
    written = saving if isinstance(saving, futures.Future) else saving.upload_completion
    _previous = PendingWrite(written, context,
                             lambda exc: CheckpointError(
                                 f"rank {rank}: save_state_dcp could not write {directory}: "
                                 f"{exc}"))
    return written_when(checkpoint, _previous.outcome)


def load_state_dcp(state_dict: dict[str, Any], checkpoint: Checkpoint | None = None, *,
                   process_group: Any = None) -> None:
    """Load a DCP checkpoint into ``state_dict`` in place (resharding to this world size);
    collective. ``checkpoint`` defaults to ``hpckit.get_checkpoint()``.

    Args:
        state_dict: The state to load into, as ``dcp.load`` takes it: shaped as this run's
            model and optimizer are (its tensors give the shards this rank reads).
        checkpoint: A checkpoint saved with :func:`save_state_dcp`; None (the default) is
            ``hpckit.get_checkpoint()``.
        process_group: The group that loads, as DCP takes it; None (the default) is the
            default group.

    Raises:
        CheckpointError: There is no checkpoint to load (a fresh run).
        HpckitError: Called outside a training run without ``checkpoint``.
    """
    checkpoint = checkpoint or get_checkpoint()
    if checkpoint is None:
        raise CheckpointError(
            "load_state_dcp(): there is no checkpoint to load (hpckit.get_checkpoint() is None "
            "on a fresh run); check `if hpckit.get_checkpoint():` first.")
    with checkpoint.as_directory() as directory:
        dcp.load(state_dict, checkpoint_id=directory, process_group=process_group)


def _group_for_async() -> Any:
    """DCP's background save runs collectives on its own thread while training runs others: it
    gets a Gloo group of its own (Gloo also being the CPU back-end it needs under NCCL), made
    once; a collective, and every rank saves at the same point."""
    global _cpu_group
    if not dist.is_initialized():
        return None
    if _cpu_group is None:
        _cpu_group = dist.new_group(backend="gloo")
    return _cpu_group


def _stager(state_dict: dict[str, Any]) -> DefaultStager | None:
    """Pinned host buffers for CUDA state, kept for the next save; None (DCP's plain copy)
    when the state is on the CPU."""
    global _pinned_stager
    if not _has_cuda_tensors(state_dict):
        return None
    if _pinned_stager is None:
        _pinned_stager = DefaultStager(StagingOptions(
            use_pinned_memory=True, use_shared_memory=False, use_async_staging=False,
            use_non_blocking_copy=True))
    return _pinned_stager


def _has_cuda_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, dict):
        return any(_has_cuda_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_cuda_tensors(v) for v in value)
    state_dict = getattr(value, "state_dict", None)
    return callable(state_dict) and _has_cuda_tensors(state_dict())
