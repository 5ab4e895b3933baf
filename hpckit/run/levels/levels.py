"""Checkpoint levels on the rank side (``CheckpointConfig(cache_dir)``, docs/multilevel.md):
which level rank 0 sends a checkpoint to, writing it into each node's cache and copying it to
the partner node in the background before it commits, copying a cached checkpoint to
storage_path, finding a cached checkpoint's files on the nodes of this job, and removing from
the caches what the manifest no longer names.

The levels say what to write and copy and what was copied; they commit nothing. Every commit
of a cached checkpoint, and its record once it reached storage_path, is a step of
:class:`~hpckit.run.commit.protocol.CommitProtocol` decided by rank 0's
:class:`~hpckit.run.commit.coordinator.Coordinator`, as any other checkpoint's.

One node's checkpoint cache (``CheckpointConfig(cache_dir)``) and who its partner is.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hpckit import faults
from hpckit.config import CheckpointConfig
from hpckit.errors import CheckpointError, ProtocolError
from hpckit.experiment.manifest import CACHE, STORAGE, CheckpointRecord, is_checkpoint_dirname
from hpckit.logs import log
from hpckit.run.mpi.comm import (
    BackgroundComm,
    captured,
    everywhere,
)
from hpckit.run.mpi.transfer import Receive, Received, Send, exchange
from hpckit.run.writing.plan import Persisted, Plan, in_background
from hpckit.run.writing.shares import write_share
from hpckit.run.writing.writer import InFlight, done_now, state_name, with_state
from hpckit.storage.copy import algorithm_of, fsync_tree, persist_file
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


if TYPE_CHECKING:
    from mpi4py.MPI import Comm

PREFERENCE = (OWN, PARTNER, RESTORE)


class Levels:
    """This rank's view of the checkpoint levels of one attempt."""

    def __init__(self, comm: Comm, config: CheckpointConfig, location: Location,
                 nodes: Nodes) -> None:
        if config.cache_dir is None:
            raise ProtocolError("checkpoint levels were set up without "
                                "CheckpointConfig(cache_dir)")
        self.comm, self.config, self.location, self.nodes = comm, config, location, nodes
        self.cache = NodeCache(config.cache_dir, location)
        self.host = nodes.hosts[comm.rank]
        self.leader = nodes.ranks_on(self.host)[0] == comm.rank
        self.partnered = config.redundancy == "partner" and len(nodes.names) > 1
        self._copies = BackgroundComm()
        if self.partnered and not self._copies.open(comm) and comm.rank == 0:
            log.warning("MPI runs without MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level or "
                        "MPI4PY_RC_THREAD_LEVEL?), so partner copies run inside report() "
                        "instead of in the background")
        if comm.rank == 0 and config.redundancy == "partner" and not self.partnered:
            log.warning("CheckpointConfig(redundancy='partner') needs two nodes or more; this "
                        "job runs on one (%s), so its cached checkpoints have no copy", self.host)

    def leveled(self, plan: Plan, kept: tuple[str, ...]) -> Plan:
        """Rank 0: the plan with its level, and every checkpoint the caches keep. In-place,
        custom-named, every ``persist_every``-th one and the one taken at a stop go to
        storage_path, in the background but for the stop's, whatever mode was asked; the
        others are written into the caches at once (a local disk) and committed there, or,
        with partners, once their partner copy, made in the background, is complete."""
        if plan.directory is None or plan.index is None:
            return replace(plan, kept=kept)
        stored = (plan.stop is not None or plan.placement.found or not is_checkpoint_dirname(plan.directory)
                  or (plan.index + 1) % self.config.persist_every == 0)
        return replace(plan, level=STORAGE if stored else CACHE,
                       asynchronous=in_background(plan.stop, stored or self.partnered),
                       kept=(*kept, plan.directory))

    def tidy(self, plan: Plan) -> None:
        if self.leader and plan.kept is not None:
            self.cache.keep_only(plan.kept)

    def write(self, plan: Plan, source: str | None, state: bytes | None = None
              ) -> tuple[Location, Callable[[], Persisted]]:
        """Where ``plan`` lies in this node's cache, and the write of this rank's files of it
        (and its resume ``state``) there: the ``local`` of the commit step that
        :class:`~hpckit.run.commit.protocol.CommitProtocol` runs, as for storage_path."""
        rank, directory = self.comm.rank, plan.checkpoint()[0]
        target = self.cache.location(directory)
        return target, with_state(lambda: Persisted(write_share(plan, target, source, rank)),
                                  target, rank, state)

    def copy_to_partner(self, plan: Plan, write: Callable[[], Persisted],
                        in_flight: InFlight) -> bool:
        """Write this rank's files into the cache now and start their copy to the partner
        node in ``in_flight``, where a failed write is raised too (as a failed hand-over of
        an asynchronous checkpoint is); a later report commits it or raises on every rank.
        Whether this rank's files are in the cache."""
        rank, directory = self.comm.rank, plan.checkpoint()[0]
        mine, failure = captured(rank, write)

        def copy() -> Persisted:
            copies = self._partner_copy(plan)  # even after a failed write: its peers wait
            if mine is None:
                raise CheckpointError(f"rank {rank} on {self.host}: caching {directory}: "
                                      f"{failure.error if failure else 'failed'}")
            return mine._replace(copies=tuple((r.name, r.checksum) for r in copies))

        in_flight.start(directory, self.cache.location(directory),
                        copy if self._copies.comm is not None else done_now(copy))
        return mine is not None

    def _partner_copy(self, plan: Plan) -> list[Received]:
        """This rank's files (and its resume state, where it has one) to the partner node, and
        the previous node's into this node's partner directory: on the background thread, on
        a communicator of its own."""
        rank, directory = self.comm.rank, plan.checkpoint()[0]
        partner = self.nodes.sends_to(rank)
        sends = [Send(partner, self.cache.path(OWN, directory, name), name)
                 for name in plan.writes.get(rank, [])]
        sends.append(Send(partner, self.cache.path(OWN, directory, state_name(rank)),
                          state_name(rank), optional=True))  # the plan cannot know of it
        receives = [Receive(source, name, self.cache.path(PARTNER, directory, name))
                    for source in self.nodes.receives_from(rank)
                    for name in [*plan.writes.get(source, []), state_name(source)]]
        received = exchange(self._copies.comm or self.comm, sends, receives,
                            lambda: faults.reached("partnering", rank), self._copies.abandoned)
        failed = [r for r in received if r.error]
        if failed:
            raise CheckpointError(f"rank {rank} on {self.host}: the partner copy of {directory} "
                                  f"failed: {failed[0].error}")
        return [r for r in received if not r.absent]

    def abandon(self) -> None:
        """The attempt ends: a partner copy still under way stops."""
        self._copies.abandon()

    def release(self) -> None:
        """Collective, after the last partner copy of an attempt that ended well."""
        self._copies.release()

    def tidy_after_persist(self, kept: list[str]) -> None:
        """Once the newest checkpoint is on storage_path: the caches keep only what the
        manifest names (``kept``)."""
        if self.leader:
            self.cache.keep_only(kept)

    def persisting(self, record: CheckpointRecord
                   ) -> tuple[Callable[[], dict[str, str]], Callable[[list[dict[str, str]]], None]]:
        """The copy of the cached checkpoint ``record`` to storage_path, each file from one
        node that holds it (the ``local`` of a commit step: its digests), and rank 0's check
        of every rank's digests against the record, before the commit records it there.
        Collective (the nodes say what they hold)."""
        where = locate(self.comm, self.cache, self.nodes, record, self.leader)[0]
        missing = [f.path for f in record.files if f.path not in where]
        if missing:
            raise CheckpointError(
                f"{record.directory} is cached on {', '.join(sorted(set(record.hosts)))} and none "
                f"of this job's nodes holds {missing[0]}; it cannot go to storage_path. The "
                "checkpoints on storage_path are intact; rerun on the nodes that cached it.")
        target = self.location.join(record.directory)
        mine = [f for f in record.files if where[f.path][0] == self.comm.rank]

        def copy() -> dict[str, str]:
            digests = {}
            for f in mine:
                digests[f.path] = persist_file(self.cache.held(record.directory, f.path),
                                               target.join(f.path), algorithm_of(f.checksum))[1]
                faults.reached("draining", self.comm.rank)
            if target.is_local and mine:
                fsync_tree(target.path, [f.path for f in mine])
            return digests

        def check(per_rank: list[dict[str, str]]) -> None:
            copied = {name: digest for d in per_rank for name, digest in d.items()}
            bad = [f.path for f in record.files if copied.get(f.path) != f.checksum]
            if bad:
                rank, level = where[bad[0]]
                raise CheckpointError(
                    f"{record.directory}/{bad[0]} read back from the node-local cache ({level} "
                    f"copy) of {self.nodes.hosts[rank]} differs from its checksum (a damaged "
                    f"local disk?); it stays cached only, and {target.display} is not recorded")

        return copy, check


def locate(comm: Comm, cache: NodeCache, nodes: Nodes, record: CheckpointRecord, leader: bool
           ) -> tuple[dict[str, tuple[int, str]], list[dict[str, str]]]:
    """Where each file of a cached checkpoint is on this job's nodes: name -> (the first rank
    of a node holding it, its level there), preferring the node that wrote it and its own
    copy; and what each rank's node holds (name -> level; empty but for nodes' first ranks)."""
    def held() -> dict[str, str]:
        found = {f.path: cache.find(record.directory, f.path, f.size) for f in record.files}
        return {name: spot[0] for name, spot in found.items() if spot is not None}

    holdings = everywhere(comm, held if leader else dict,
                          f"finding {record.directory} in the node-local caches", CheckpointError)
    where = {}
    for f in record.files:
        writer = (record.hosts[f.rank] if f.rank is not None and f.rank < len(record.hosts)
                  else None)
        choices = sorted((PREFERENCE.index(h[f.path]), nodes.hosts[rank] != writer, rank)
                         for rank, h in enumerate(holdings) if f.path in h)
        if choices:
            where[f.path] = (choices[0][2], PREFERENCE[choices[0][0]])
    return where, holdings
