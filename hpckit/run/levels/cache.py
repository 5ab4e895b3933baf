"""One node's checkpoint cache (``CheckpointConfig(cache_dir)``) and who its partner is.

Under ``{cache_dir}/hpckit-{experiment}-{key}/`` a node keeps ``own/{checkpoint}/`` (the files
its ranks wrote), ``partner/{checkpoint}/`` (the files the previous node's ranks wrote, when
``redundancy="partner"``) and ``restore/{checkpoint}/`` (a whole checkpoint assembled for a
restart). Every rank writes its own files there; the node's first rank removes what the
manifest no longer names. Nodes are ordered by their first rank; node k's partner is node
k+1 (the last node's is node 0), and rank i of a node sends to rank i (modulo its size) of
the partner.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hpckit.errors import CheckpointError
from hpckit.logs import log
from hpckit.storage.location import Location

OWN, PARTNER, RESTORE = "own", "partner", "restore"


@dataclass(frozen=True)
class Nodes:
    """Every rank's host, in rank order, and what follows from it."""

    hosts: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        """The nodes in the order of their first rank."""
        return list(dict.fromkeys(self.hosts))

    def ranks_on(self, host: str) -> list[int]:
        return [rank for rank, h in enumerate(self.hosts) if h == host]

    def partner_of(self, host: str) -> str:
        names = self.names
        return names[(names.index(host) + 1) % len(names)]

    def sends_to(self, rank: int) -> int:
        """The rank that keeps the partner copy of what ``rank`` wrote."""
        host = self.hosts[rank]
        targets = self.ranks_on(self.partner_of(host))
        return targets[self.ranks_on(host).index(rank) % len(targets)]

    def receives_from(self, rank: int) -> list[int]:
        return [source for source in range(len(self.hosts))
                if len(self.names) > 1 and self.sends_to(source) == rank]


class NodeCache:
    """The cache directory of one experiment on this node."""

    def __init__(self, cache_dir: str, experiment: Location) -> None:
        key = hashlib.sha256(experiment.display.encode()).hexdigest()[:12]
        self.root = os.path.join(cache_dir, f"hpckit-{experiment.name}-{key}")
        self._said_unremovable = False

    def path(self, level: str, directory: str, name: str = "") -> str:
        return os.path.join(self.root, level, directory, name) if name else \
            os.path.join(self.root, level, directory)

    def location(self, directory: str) -> Location:
        from hpckit.storage.location import local

        return local(self.path(OWN, directory))

    def find(self, directory: str, name: str, size: int | None = None
             ) -> tuple[str, str] | None:
        """(level, path) of the first copy of ``name`` of checkpoint ``directory`` on this
        node, at ``size`` when given (its checksum is checked as it is read)."""
        for level in (OWN, PARTNER, RESTORE):
            path = self.path(level, directory, name)
            if os.path.isfile(path) and (size is None or os.path.getsize(path) == size):
                return level, path
        return None

    def held(self, directory: str, name: str) -> str:
        """The path of ``name`` of checkpoint ``directory``, which this node was found to hold."""
        found = self.find(directory, name)
        if found is None:
            raise CheckpointError(
                f"{directory}/{name} was in {self.root} on {socket.gethostname()} a moment ago "
                "and is gone now: something else removes files from the node-local cache while "
                "hpckit runs; give each run a cache_dir of its own")
        return found[1]

    def keep_only(self, kept: Iterable[str]) -> None:
        """Remove every cached checkpoint the manifest no longer names (node's first rank).
        What cannot be removed is said once, and tried again at the next prune."""
        names = set(kept)
        for level in (OWN, PARTNER, RESTORE):
            parent = os.path.join(self.root, level)
            for entry in os.listdir(parent) if os.path.isdir(parent) else []:
                if entry not in names:
                    shutil.rmtree(os.path.join(parent, entry), onerror=self._unremovable)

    def _unremovable(self, _function: object, path: str, excinfo: tuple[Any, ...]) -> None:
        error = excinfo[1]
        if not self._said_unremovable:
            self._said_unremovable = True
            log.warning("could not remove %s from the node-local cache on %s (%s); the cache "
                        "keeps growing until it can: check its permissions and free space, or "
                        "remove it by hand once the run ends (said once)", path,
                        socket.gethostname(), error)
