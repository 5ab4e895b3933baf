"""A restart from the node-local caches (``CheckpointConfig(cache_dir)``), before the
experiment is opened: the newest cached checkpoint that this job's nodes hold completely is
assembled on every node (``restore/``), each file from this node's own cache, a partner's
copy, or sent over MPI by the node that holds it, and checked against the manifest's
checksums. Cached checkpoints newer than it, which no node can serve, are dropped when the
experiment opens; with none to serve, the run resumes from storage_path and says why."""

from __future__ import annotations

import os
import shutil
import socket
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpckit.config import CheckpointConfig
from hpckit.errors import CheckpointError, HpckitError, StorageError
from hpckit.experiment.manifest import CheckpointRecord
from hpckit.experiment.reading import read_manifest
from hpckit.logs import log
from hpckit.run.levels.levels import OWN, RESTORE, Levels, NodeCache, Nodes, locate
from hpckit.run.mpi.comm import all_reduce, everywhere, on_root
from hpckit.run.mpi.transfer import Receive, Send, exchange
from hpckit.storage.copy import algorithm_of, checksum_file
from hpckit.storage.location import Location

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


@dataclass(frozen=True)
class Restored:
    """The cached checkpoint this attempt starts from (None: storage_path serves it)."""

    directory: str | None = None
    path: str | None = None  # this node's assembled copy


def prepare(comm: Comm, config: CheckpointConfig, location: Location
            ) -> tuple[Levels | None, Restored]:
    """Collective, before the experiment opens: the attempt's levels, and the cached
    checkpoint it restarts from (none without ``cache_dir``)."""
    if config.cache_dir is None:
        return None, Restored()
    nodes = Nodes(tuple(everywhere(comm, socket.gethostname, "naming the nodes")))
    return Levels(comm, config, location, nodes), restore_cached(comm, config, location, nodes)


def restore_cached(comm: Comm, config: CheckpointConfig, location: Location,
                   nodes: Nodes) -> Restored:
    """Collective: assemble the newest cached checkpoint this job can read completely."""
    if config.cache_dir is None:
        return Restored()
    _, (candidates, named) = on_root(comm, lambda: (None, _candidates(location)),
                                     f"reading the manifest of {location.display}", StorageError)
    cache = NodeCache(config.cache_dir, location)
    leader = nodes.ranks_on(nodes.hosts[comm.rank])[0] == comm.rank
    if leader:
        cache.keep_only(named)  # what a killed run left, uncommitted
    for record in candidates:
        where, holdings = locate(comm, cache, nodes, record, leader)
        missing = [f.path for f in record.files if f.path not in where]
        if missing:
            _say_unreachable(comm, record, nodes, f"no node of this job holds {missing[0]}")
            continue
        try:
            counts = _assemble(comm, cache, nodes, record, where, holdings, leader)
        except HpckitError as exc:
            _say_unreachable(comm, record, nodes, str(exc))
            continue
        if comm.rank == 0:
            log.info("restarting from %s in the node-local caches (files from a node's own "
                     "cache: %d, from partner copies: %d, restored before: %d, sent between "
                     "nodes: %d); nothing read from storage_path", record.directory,
                     counts["own"], counts["partner"], counts["restore"], counts["sent"])
        return Restored(record.directory, cache.path(RESTORE, record.directory))
    return Restored()


def _candidates(location: Location) -> tuple[list[CheckpointRecord], list[str]]:
    """Cached checkpoints newer than the newest on storage_path, newest first; and every
    checkpoint the manifest names."""
    manifest = read_manifest(location)
    if manifest is None:
        return [], []
    stored = max((r.index for r in manifest.checkpoints if r.on_storage), default=-1)
    cached = [r.read() for r in manifest.checkpoints if not r.on_storage and r.index > stored]
    return (sorted(cached, key=lambda r: r.index, reverse=True),
            [r.directory for r in manifest.checkpoints])


def _say_unreachable(comm: Comm, record: CheckpointRecord, nodes: Nodes, why: str) -> None:
    if comm.rank == 0:
        log.warning("%s is in the node-local caches of %s; this job runs on %s and cannot "
                    "restart from it (%s): trying an older checkpoint, or storage_path",
                    record.directory, ", ".join(dict.fromkeys(record.hosts)),
                    ", ".join(nodes.names), why)


def _assemble(comm: Comm, cache: NodeCache, nodes: Nodes, record: CheckpointRecord,
              where: dict[str, tuple[int, str]], holdings: list[dict[str, str]],
              leader: bool) -> Counter[str]:
    """Every node's first rank gets every file into ``restore/``: linked from its own
    cache or partner copy, or received from the node ``where`` names; all are checked."""
    rank, directory = comm.rank, record.directory
    leaders = [nodes.ranks_on(host)[0] for host in nodes.names]
    sends = [Send(other, _path(cache, directory, name), name)
             for name, (server, _) in where.items() if server == rank
             for other in leaders if name not in holdings[other]]
    receives = [Receive(where[f.path][0], f.path, cache.path(RESTORE, directory, f.path),
                        algorithm_of(f.checksum))
                for f in record.files if leader and f.path not in holdings[rank]]

    def assemble() -> Counter[str]:
        received = {r.name: r for r in exchange(comm, sends, receives)}
        counts: Counter[str] = Counter()
        for f in record.files if leader else ():
            if f.path in received:
                got = received[f.path]
                digest = got.checksum if got.error is None else f"({got.error})"
                counts["sent"] += 1
            else:
                digest = _link(cache, directory, f.path, algorithm_of(f.checksum))
                counts[holdings[rank][f.path]] += 1
            if digest != f.checksum:
                raise CheckpointError(f"rank {rank} on {nodes.hosts[rank]}: {directory}/{f.path} "
                                      f"does not match its checksum in the manifest ({digest})")
        _relink_own(cache, record, nodes.hosts[rank]) if leader else None
        return counts

    return all_reduce(comm, f"restoring {directory} from the node-local caches", assemble,
                      lambda per_rank: sum(per_rank, Counter()), CheckpointError)


def _path(cache: NodeCache, directory: str, name: str) -> str:
    return cache.held(directory, name)


def _link(cache: NodeCache, directory: str, name: str, algorithm: str) -> str:
    """Hard-link (or copy) this node's copy into ``restore/``; its checksum."""
    source, target = _path(cache, directory, name), cache.path(RESTORE, directory, name)
    if not (os.path.isfile(target) and os.path.samefile(source, target)):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target):
            os.unlink(target)
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    return checksum_file(target, algorithm=algorithm)[1]


def _relink_own(cache: NodeCache, record: CheckpointRecord, host: str) -> None:
    """A node whose disk was lost gets its own files back, from the assembled copy."""
    for f in record.files:
        own = cache.path(OWN, record.directory, f.path)
        mine = f.rank is not None and f.rank < len(record.hosts) and record.hosts[f.rank] == host
        if mine and not os.path.isfile(own):
            os.makedirs(os.path.dirname(own), exist_ok=True)
            os.link(cache.path(RESTORE, record.directory, f.path), own)
