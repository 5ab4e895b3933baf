"""A committed checkpoint handed to ``report()`` again (``report(checkpoint=get_checkpoint())``
after an evaluation-only epoch, or another experiment's checkpoint) is read from links to its
files that this rank makes in its staging before the ranks meet. At that meeting rank 0 may
commit an earlier report's checkpoint and retention evict the very checkpoint handed here,
deleting it while the hand-over still reads it: the links keep its bytes until the hand-over
is done, and the committed files themselves are never changed (links are only read, then
removed)."""

from __future__ import annotations

from dataclasses import replace

from hpckit.experiment import ownership
from hpckit.run.writing.staging import Handed, Staging


def pinned(handed: Handed, staging: Staging) -> Handed:
    """``handed``, reading from links this rank pins where its source is a committed checkpoint
    of any experiment; as it was otherwise."""
    source = handed.source
    if (source is None or handed.in_place or handed.files is None
            or not ownership.in_experiment(source)):
        return handed
    pin = staging.pin(source, [name for name, _ in handed.files])
    return replace(handed, source=pin, pinned=True)
