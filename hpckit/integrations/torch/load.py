"""Loading a file of a checkpoint with torch: checked against the manifest, weights only."""

from __future__ import annotations

import os
import pickle
from typing import Any

from hpckit import settings
from hpckit.checkpoint import Checkpoint, location_of
from hpckit.errors import CheckpointError, HpckitError
from hpckit.experiment.manifest import FileRecord, is_rank_state, is_safe_relpath
from hpckit.experiment.reading import read_manifest
from hpckit.integrations.torch.distributed import device
from hpckit.logs import log
from hpckit.storage.copy import algorithm_of, checksum_file, short


def load_state(checkpoint: Checkpoint, filename: str = "state.pt", *, map_location: Any = None,
               weights_only: bool = True) -> Any:
    """``torch.load`` one file of ``checkpoint``, onto this rank's device by default.

    When the checkpoint belongs to an experiment, the file's size and checksum are checked
    against the manifest first, so a damaged file is an error rather than a silently wrong
    model. ``weights_only=True`` (the default) refuses pickled code; pass ``False`` only for
    files you trust. hpckit's own (Ray has no such call).

    Args:
        checkpoint: The checkpoint to read from, such as ``hpckit.get_checkpoint()`` or
            ``result.checkpoint``; local or on remote storage (then downloaded once per
            node).
        filename: The file's path inside the checkpoint, relative (default ``"state.pt"``,
            what :func:`save_state` writes by default).
        map_location: As ``torch.load``'s; None (the default) loads onto this rank's device
            (``hpckit.torch.get_device()``).
        weights_only: As ``torch.load``'s: True (the default) loads tensors and plain
            containers only; False unpickles anything.

    Returns:
        The object ``torch.load`` returns.

    Raises:
        CheckpointError: ``checkpoint`` is not a ``Checkpoint``, ``filename`` is not a
            relative path inside it or is missing, the file is damaged (its size or
            checksum differs from the manifest's), or weights-only loading refuses it.
    """
    import torch

    if not isinstance(checkpoint, Checkpoint):
        raise CheckpointError(f"load_state(checkpoint={checkpoint!r}) needs an hpckit.Checkpoint, "
                              "e.g. hpckit.get_checkpoint() or result.checkpoint.")
    if not is_safe_relpath(filename):
        raise CheckpointError(f"load_state(filename={filename!r}) must be a relative path inside "
                              "the checkpoint, such as 'state.pt' or 'model/rank-0.pt'.")
    if not isinstance(weights_only, bool):
        raise CheckpointError(f"load_state(weights_only={weights_only!r}) must be True or False.")
    expected = _expected(checkpoint, filename)
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, filename)
        if not os.path.isfile(path):
            held = sorted(name for name in os.listdir(directory) if not is_rank_state(name))
            raise CheckpointError(f"checkpoint {checkpoint.uri} has no file {filename!r}; it holds "
                                  f"{', '.join(held) or 'nothing'}.")
        if expected is not None:
            _check(checkpoint, path, expected)
        try:
            return torch.load(path, map_location=map_location if map_location is not None
                              else device(), weights_only=weights_only)
        except pickle.UnpicklingError as exc:
            if not weights_only:
                raise
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"{checkpoint.uri}/{filename} holds objects that weights-only loading refuses "
                f"({reason}). Save plain state dicts and tensors, or, if you trust this file, "
                "pass weights_only=False.") from exc


def _expected(checkpoint: Checkpoint, filename: str) -> FileRecord | None:
    """The manifest's record of the file, if the checkpoint is one of an experiment's."""
    location = location_of(checkpoint)
    rank = settings.current().launched_rank
    try:
        manifest = read_manifest(location.parent)
        record = next((r for r in manifest.checkpoints if r.directory == location.name),
                      None) if manifest is not None else None
        return record.file(filename, int(rank) if rank.isdigit() else None) if record else None
    except HpckitError as exc:
        log.debug("not verifying %s: its manifest or records could not be read (%s)",
                  checkpoint.uri, exc)
        return None


def _check(checkpoint: Checkpoint, path: str, expected: FileRecord) -> None:
    size, digest = checksum_file(path, algorithm=algorithm_of(expected.checksum))
    if size != expected.size or digest != expected.checksum:
        found = f"size {size}" if size != expected.size else f"checksum {short(digest)}"
        raise CheckpointError(
            f"{checkpoint.uri}/{expected.path} is damaged: {found}, but the manifest recorded size "
            f"{expected.size} and checksum {short(expected.checksum)}. Load an older checkpoint "
            f"(hpckit ls shows them; hpckit verify checks them all).")
