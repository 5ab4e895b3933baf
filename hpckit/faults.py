"""Fault points: where hpckit's own fault-injection tests kill a rank, deterministically.

Off unless ``HPCKIT_FAULT`` is set (parsed with the other settings, see
:mod:`hpckit.settings`); an unset variable costs one comparison per point. Its value is
``PHASE:RANK:N`` or ``PHASE:RANK:N:all``: the N-th time rank RANK reaches PHASE it kills itself
with SIGKILL; with ``all`` it kills its whole process group instead (every rank and the
launcher, as when a node loses power). The phases of the commit protocol, in the order a
report meets them:

``writing``    a rank has persisted the first of its files; its others may not be written
``written``    a rank has persisted all of its files and not yet told rank 0
``gathered``   rank 0 holds every rank's outcome and has not replaced the manifest
``committed``  rank 0 has replaced the manifest and not yet applied retention
``evicting``   rank 0 has deleted part of a checkpoint that retention evicts

and those of an asynchronous checkpoint (``report(checkpoint_upload_mode=ASYNC)``):

``taking``     a rank has moved one more file of a handed directory into staging (after
               each move); its journal records them all, the others are still the user's
``handed``     a rank has handed its files over to staging; report() has not returned
``background`` a rank's background thread has persisted the first of its files
``persisted``  a rank's background thread has persisted all of them; nothing is committed

and those of a checkpoint in node-local caches (``CheckpointConfig(cache_dir)``):

``partnering`` a rank has received part of its partner's files; the checkpoint is not committed
``draining``   a rank has copied a cached checkpoint's first file to storage_path; the manifest
               still records it as cached only

and those of ``hpckit.torch.save_state``:

``staging``     a rank has copied its state into staging memory; nothing is written yet
``serialising`` a rank's save thread has written the file into the pending checkpoint;
                report() has not persisted it

and that of exact resume: ``resume_state``, a rank has written its resume state file
after its share of the checkpoint, and has not told rank 0;

and, on rank 0, ``committing``: every rank has finished a background checkpoint and rank 0's
commit thread is about to write its metrics line and manifest, while the ranks train on;
``validating``: a committed checkpoint's validation process has started, and its outcome is
not recorded yet;

and that of a sweep's PBT exploit: ``exploiting``, the rank 0 of a trial's group has copied
one more file of the donor's checkpoint into the trial's next checkpoint, not yet committed.

Random-time kills need no hook: the tests send SIGKILL from outside. Ground layer.
"""

from __future__ import annotations

import os
import signal

from hpckit import settings
from hpckit.variables import FAULT_PHASES as PHASES
from hpckit.variables import FaultPoint

__all__ = ["PHASES", "reached"]

_seen = 0


def reached(phase: str, rank: int) -> None:
    """Mark that ``rank`` reached ``phase``; dies here when the armed fault says so."""
    global _seen
    fault: FaultPoint | None = settings.current().fault
    if fault is None or fault.phase != phase or fault.rank != rank:
        return
    _seen += 1
    if _seen == fault.occurrence:
        if fault.whole_group:
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
