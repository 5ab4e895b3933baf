"""A background write whose failure must reach the user exactly once.

``save_state`` and ``save_state_dcp`` write files after they return. ``report()`` waits for
the writes of the checkpoint it is given and raises their errors; a write whose checkpoint no
report takes (a save overwritten by the next one before any report) would otherwise fail
unheard. Its error is raised instead at the next save of the same kind in the same attempt.
An earlier attempt's write is not this attempt's to fail on: its error belonged to a run that
ended anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from typing import Any

from hpckit.errors import CheckpointError


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
