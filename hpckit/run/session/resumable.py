"""What a rank keeps for an exact resume beyond its checkpoint files: its random streams and
its data loaders' positions, each held by a *keeper* (an object with ``state_dict`` and
``load_state_dict``). Their states are pickled together at every report that writes a
checkpoint (gathered to the rank's node leader, which stores its node's as one file of it:
``run.writing.rankstate``) and given back to the
keepers at the first ``get_checkpoint()`` of a resumed attempt, where the training function
has built its model and loaders and is about to train. A keeper that registers later (a
loader prepared after ``get_checkpoint()``) gets its state when it registers.

The random streams are kept where the run's back-end says so (``Backend.keepers``:
``TorchTrainer``'s keeps Python's, NumPy's and torch's; a ``DataParallelTrainer`` none), the
loaders wherever ``prepare_data_loader`` made one; both in the attempt's :class:`RankState`."""

from __future__ import annotations

import pickle
import random
import sys
from typing import Any, Protocol

from hpckit.logs import log
from hpckit.run.writing.writer import read_state
from hpckit.storage.location import Location

FORMAT = 1


class Keeper(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class PythonRandom:
    """Python's ``random`` and NumPy's global generator (where NumPy is loaded)."""

    def state_dict(self) -> dict[str, Any]:
        numpy = sys.modules.get("numpy")
        return {"python": random.getstate(),
                "numpy": numpy.random.get_state() if numpy is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        numpy = sys.modules.get("numpy")
        if state["numpy"] is not None and numpy is not None:
            numpy.random.set_state(state["numpy"])




class RankState:
    """One rank's keepers for one attempt, and the state it resumes from."""

    def __init__(self, rank: int, world_size: int, start: Location | None,
                 enabled: bool = True, streams: dict[str, Keeper] | None = None,
                 leader: int | None = None) -> None:
        self.rank, self.world_size, self.enabled = rank, world_size, enabled
        self.leader = rank if leader is None else leader  # its node's first rank
        self.keepers: dict[str, Keeper] = dict(streams or {})
        self._start = start if enabled else None  # the checkpoint this attempt resumes from
        self._waiting: dict[str, Any] = {}  # restored states whose keepers are not here yet
        self._loaders = 0

    def close(self) -> None:
        """At the attempt's end: the loaders let go (a loader's pass cut by a ``break`` holds
        its worker processes until then, which must not outlive the attempt)."""
        for keeper in self.keepers.values():
            close = getattr(keeper, "close", None)
            if close is not None:
                close()
        self.keepers = {}

    def keep_loader(self, keeper: Keeper) -> str:
        """Keep a prepared loader's position; the name it is kept under (``loader-0`` for
        the first prepared, ...)."""
        name = f"loader-{self._loaders}"
        self._loaders += 1
        self.keepers[name] = keeper
        if name in self._waiting:
            keeper.load_state_dict(self._waiting.pop(name))
        return name

    def capture(self) -> bytes | None:
        """Every keeper's state now, pickled: at a report that writes a checkpoint (None
        where nothing is kept). The first one after a resume says which saved positions no
        loader of this program took (it prepares fewer loaders than the run that saved
        them)."""
        if self._waiting:
            if self.rank == 0:
                log.warning("the checkpoint this run resumed from holds the position of %s, "
                            "which this program did not prepare (it prepares %d loader(s)): "
                            "ignored", ", ".join(sorted(self._waiting)), self._loaders)
            self._waiting = {}
        if not self.keepers:
            return None
        states = {name: keeper.state_dict() for name, keeper in self.keepers.items()}
        return pickle.dumps({"format": FORMAT, "world_size": self.world_size,
                             "states": states}, protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self) -> None:
        """At the first ``get_checkpoint()`` of a resumed attempt: every keeper's state from
        the checkpoint it resumes from (once; later calls change nothing)."""
        start, self._start = self._start, None
        if start is None or not self.keepers:  # nothing kept: nothing to put back or miss
            return
        data = read_state(start, self.rank, self.leader)
        saved = pickle.loads(data) if data is not None else None
        if saved is None or saved.get("format") != FORMAT or saved["world_size"] != self.world_size:
            self._say_not_restored(start, saved)
            return
        states = saved["states"]
        for name, keeper in self.keepers.items():
            if name in states:
                keeper.load_state_dict(states.pop(name))
        self._waiting = states

    def _say_not_restored(self, start: Location, saved: dict[str, Any] | None) -> None:
        if self.rank != 0:
            return
        if saved is None:
            log.warning("%s holds no resume state of rank 0 (written before hpckit kept one, "
                        "or with CheckpointConfig(exact_resume=False)): random streams and "
                        "loader positions start afresh", start.display)
        else:
            log.warning("%s was written by %d ranks and this run has %d: random streams and "
                        "loader positions start afresh (an exact resume needs %d ranks, e.g. "
                        "hpckit resume -n %d)", start.display, saved["world_size"],
                        self.world_size, saved["world_size"], saved["world_size"])
