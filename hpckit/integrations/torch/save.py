"""``save_state``: ``torch.save`` into the pending checkpoint, blocking training only for a copy.

The state is copied into staging memory before :func:`save_state` returns: tensors into
buffers allocated once per file and reused at every later save (pinned host memory for CUDA
tensors, copied without blocking on the tensors' stream), everything else deep-copied. A
thread of this process then serialises the copy with ``torch.save`` into the pending
checkpoint; ``report()`` waits for it before it reads the checkpoint's files (in the
background with ``checkpoint_upload_mode=ASYNC``). The file is exactly what ``torch.save``
writes, so ``torch.load`` and :func:`hpckit.torch.load_state` read it.

The same file's next save waits for the previous one to be written (its buffers are reused),
so at most one write per file is in flight: checkpoints taken faster than they are written
slow training down to the writes' pace instead of filling memory.

A background write whose failure must reach the user exactly once.

``save_state`` and ``save_state_dcp`` write files after they return. ``report()`` waits for
the writes of the checkpoint it is given and raises their errors; a write whose checkpoint no
report takes (a save overwritten by the next one before any report) would otherwise fail
unheard. Its error is raised instead at the next save of the same kind in the same attempt.
An earlier attempt's write is not this attempt's to fail on: its error belonged to a run that
ended anyway.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from typing import Any

import torch

from hpckit import faults
from hpckit.background import IDLE, Worker
from hpckit.checkpoint import Checkpoint
from hpckit.errors import CheckpointError
from hpckit.experiment.manifest import is_safe_relpath
from hpckit.run.session.session import get_context
from hpckit.writes import writing_into

__all__ = ["save_state"]

_writer = Worker("hpckit-save-state", IDLE)  # one thread: at most one write per file in flight
_staging: dict[str, Staging] = {}  # by file name: its buffers, and the write that reads them
_lock = threading.Lock()


def save_state(obj: Any, filename: str = "state.pt") -> Checkpoint:
    """Save ``obj`` (a state dict, or any structure of dicts, lists and tensors) as
    ``filename`` in this report's pending checkpoint, like ``torch.save``; returns the
    checkpoint to hand to ``hpckit.report()``.

    ``obj`` may change as soon as this returns: its tensors were copied into staging memory,
    and the file is written in the background. Call it once per file (each rank its own
    names, e.g. ``f"model-rank{rank}.pt"`` where ranks hold different state), then
    ``report(metrics, checkpoint=..., checkpoint_upload_mode="async")`` to keep the whole
    checkpoint off the training loop (a synchronous report waits for the write first).
    hpckit's own (Ray has no such call).

    Args:
        obj: What to save: a state dict, or any structure of dicts, lists, tuples and
            tensors; tensors are copied into reused staging buffers, anything else is
            deep-copied.
        filename: The file's path inside the checkpoint, relative (default
            ``"state.pt"``); give each rank's file its own name where ranks hold different
            state. A second save of the same name waits for the first to be written.

    Returns:
        The pending checkpoint (``get_context().get_checkpoint_dir()``), to pass to
        ``hpckit.report()``.

    Raises:
        CheckpointError: ``filename`` is not a relative path inside the checkpoint, or the
            previous save of this file failed where no report took it.
        HpckitError: Called outside a training run.
    """
    if not is_safe_relpath(filename):
        raise CheckpointError(f"save_state(filename={filename!r}) must be a relative path inside "
                              "the checkpoint, such as 'state.pt' or 'model/rank-0.pt'.")
    context = get_context()
    rank, directory = context.get_world_rank(), context.get_checkpoint_dir()
    path = os.path.join(directory, filename)
    staging = _staging_for(filename)
    staging.wait_until_free(context, filename)
    snapshot = staging.copy_of(obj)
    faults.reached("staging", rank)
    written = PendingWrite(_writer.submit(_write, snapshot, staging.copied, path, rank),
                           context, lambda exc: CheckpointError(
                               f"rank {rank}: save_state could not write {path}: {exc}"))
    staging.in_use = written
    writing_into(directory, filename, written.outcome)
    return Checkpoint.from_directory(directory)


class Staging:
    """One file's staging memory: a buffer per tensor, reused while shapes and dtypes stay."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self.in_use: PendingWrite | None = None
        self.copied: torch.cuda.Event | None = None

    def wait_until_free(self, attempt: object, filename: str) -> None:
        """The previous save of this file has been written; its error is report()'s, or,
        where no report took it, this save's."""
        if self.in_use is not None:
            self.in_use.raise_untold(attempt, f"the next save_state of {filename}")

    def copy_of(self, obj: Any) -> Any:
        self.copied = None
        snapshot = self._copy(obj, ())
        if self.copied is not None:
            self.copied.record()
        return snapshot

    def _copy(self, value: Any, where: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._staged(value, where)
        if isinstance(value, dict):
            copied = {key: self._copy(item, (*where, key)) for key, item in value.items()}
            return copied if type(value) is dict else _same_kind(value, copied)
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(self._copy(item, (*where, i)) for i, item in enumerate(value))
        return copy.deepcopy(value)

    def _staged(self, tensor: torch.Tensor, where: tuple[Any, ...]) -> torch.Tensor:
        source = tensor.detach()
        buffer = self.buffers.get(where)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu",
                                 pin_memory=source.is_cuda)
            self.buffers[where] = buffer
        buffer.copy_(source, non_blocking=source.is_cuda)
        if source.is_cuda and self.copied is None:
            self.copied = torch.cuda.Event()
        return buffer


def _same_kind(original: dict[Any, Any], copied: dict[Any, Any]) -> dict[Any, Any]:
    """An OrderedDict (a state_dict) stays one, with its ``_metadata`` (module versions)."""
    made = type(original)(copied)
    metadata = getattr(original, "_metadata", None)
    if metadata is not None:
        setattr(made, "_metadata", copy.deepcopy(metadata))  # noqa: B010  (torch.nn.Module.state_dict's attribute)
    return made


def _write(snapshot: Any, copied: torch.cuda.Event | None, path: str, rank: int) -> None:
    if copied is not None:
        copied.synchronize()  # the device-to-host copies save_state started
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Into a Python file, not a path: torch's own file writer holds the GIL while it writes
    # (26 ms of a 64 MiB save stalled the training thread; through a file object, under 1 ms:
    # benchmarks/gil_stalls.py).
    with open(path, "wb") as f:
        torch.save(snapshot, f)
    faults.reached("serialising", rank)


def _staging_for(filename: str) -> Staging:
    with _lock:
        return _staging.setdefault(filename, Staging())


class PendingWrite:
    """One save's write, the attempt it belongs to, and whether its outcome has been told."""

    def __init__(self, future: Future[Any], attempt: object,
                 described: Callable[[BaseException], CheckpointError]) -> None:
        self.future = future
        self.attempt = attempt
        self.described = described
        self.told = False

    def outcome(self) -> Any:
        """For ``report()``: wait, and raise the write's error."""
        self.told = True
        try:
            return self.future.result()
        except Exception as exc:
            raise self.described(exc) from exc

    def raise_untold(self, attempt: object, next_save: str) -> None:
        """For the next save: wait until the write is over, and raise its error if no report
        took it."""
        wait_for([self.future])
        error = self.future.exception()
        if error is None or self.told or attempt is not self.attempt:
            return
        self.told = True
        raise CheckpointError(f"{self.described(error)}; no report() took that checkpoint, so "
                              f"{next_save} says it. Report each saved checkpoint, or check "
                              "the path and free space before saving again.") from error
