"""``report(checkpoint_upload_fn=fn)``, as in Ray 2.60: each rank's ``fn(checkpoint,
checkpoint_dir_name)`` uploads its files itself, straight into the checkpoint's directory in
the experiment, in place of hpckit's copy, and returns a checkpoint of that directory.

hpckit cannot know when another rank's upload is done, so the ranks meet once every rank's
``fn`` has returned: only then is the directory complete, and every rank lists the same
files. Each rank then hashes its share of them where they lie (read back from object
storage), and the checkpoint is committed as one written in place. With ``ASYNC`` all of it
runs on the in-flight thread, and the ranks meet there, on a communicator of their own.
Here: the check of what ``fn`` returns, and the meeting (``staging.upload`` calls ``fn``,
``writer.ShareWriter`` runs the steps, ``shares.hash_uploaded`` hashes).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from hpckit.checkpoint import Checkpoint, location_of
from hpckit.errors import CheckpointError, ProtocolError
from hpckit.run.mpi.comm import for_background, free_background, retire_background
from hpckit.run.mpi.waiting import wait_for_all
from hpckit.storage.location import Location

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

BACKGROUND_LOOKS = 0.05  # seconds at most between a background meeting's looks


def check_returned(returned: Any, target: Location, rank: int) -> None:
    """The checkpoint ``checkpoint_upload_fn`` returned is ``target``, on the experiment's
    storage (Ray requires it inside the run's storage; hpckit commits that directory)."""
    if not isinstance(returned, Checkpoint):
        raise CheckpointError(f"rank {rank}: checkpoint_upload_fn returned {returned!r}; it must "
                              "return a Checkpoint, as in Ray.")
    if not _same_place(location_of(returned), target):
        how = ("Checkpoint.from_directory() of it" if target.is_local else
               "Checkpoint(path, get_context().get_storage_filesystem()) of it")
        raise CheckpointError(
            f"rank {rank}: checkpoint_upload_fn returned a checkpoint at {returned.uri}, "
            f"outside this checkpoint's directory in the experiment; upload into "
            f"{target.display} (the checkpoint_dir_name it is given, under "
            f"get_context().get_experiment_path()) and return {how}.")


def _same_place(where: Location, target: Location) -> bool:
    if where.is_local or target.is_local:
        return (where.is_local and target.is_local
                and os.path.realpath(where.path) == os.path.realpath(target.path))
    return (_service(where) == _service(target)
            and where.path.strip("/") == target.path.strip("/"))


def _service(location: Location) -> tuple[str, str]:
    """The kind of storage and, for S3, its endpoint (among the options pyarrow pickles)."""
    filesystem = location.filesystem
    reduced = filesystem.__reduce__()
    options = reduced[1][0] if len(reduced) > 1 and reduced[1] else {}
    endpoint = options.get("endpoint_override", "") if isinstance(options, dict) else ""
    return filesystem.type_name, str(endpoint)


class Meeting:
    """Where the ranks wait, each after its ``checkpoint_upload_fn``, until every rank's has
    returned: inside ``report()`` on its communicator, in the background on a duplicate."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self._own: Comm | None = None
        self._asked = False
        self._abandon = threading.Event()

    def in_background(self) -> bool:
        """Whether the ranks can meet on the in-flight thread. The first call makes its
        communicator: collective, on the training thread, at the same report on every rank."""
        if not self._asked:
            self._asked = True
            self._own = for_background(self.comm)
        return self._own is not None

    def meet(self, background: bool) -> None:
        if background:  # maybe long (another rank's upload): the training thread keeps the GIL
            if self._own is None:
                raise ProtocolError("a meeting in the background before in_background() said "
                                    "the ranks can meet there")
            wait_for_all(self._own, check=self._go_on, longest=BACKGROUND_LOOKS)
        else:
            wait_for_all(self.comm)

    def _go_on(self) -> None:
        if self._abandon.is_set():
            raise CheckpointError(
                f"rank {self.comm.rank}: waiting for the other ranks' checkpoint_upload_fn was "
                "abandoned: the attempt ended (a rank may be gone); the next attempt starts "
                "afresh")

    def abandon(self) -> None:
        """The attempt ends: a background wait still under way stops (its peers may be gone),
        and a communicator not released is retired."""
        if self._own is not None and not self._abandon.is_set():
            retire_background(self._own)  # kept here: a wait under way may still use it
        self._abandon.set()

    def release(self) -> None:
        """Collective, after the last upload of an attempt that ended well."""
        if self._own is not None and not self._abandon.is_set():
            free_background(self._own)
            self._own = None
