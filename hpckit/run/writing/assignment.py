"""Which rank writes which file of a checkpoint, told in as few bytes as the ranks need, and
the merge of what they wrote.

Each name a rank hands is written by that rank, unless several ranks hand the same name: the
lowest of them writes it and the others hash theirs, for comparison. So the plan carries only
the names several ranks hand, with their writers (``Plan.shared``), and every rank derives its
own part from the names it handed itself (:func:`own_part`): the plan is the same few bytes at
any rank count. (A checkpoint for the node-local caches also carries every rank's names: a
partner node receives them.)

A rank that hands the same names and sizes as the last time it handed any sends, instead of
the list, the number of the report that sent it (:class:`SentFiles`), and rank 0, which
remembers the lists (:class:`HandedFiles`), reuses the last assignment when no list changed:
in the steady state, no list of names crosses the network, rank 0 assigns nothing, and the
ranks' announcements are alike, so that each node's leader sends rank 0 one of them for all
its ranks (``run.mpi.leaders``).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain, repeat

import xxhash

from hpckit.errors import CheckpointError, ProtocolError
from hpckit.experiment.manifest import CACHE, FileRecord, is_rank_state, is_safe_relpath
from hpckit.run.writing.plan import NodeRecords, Persisted, Plan, Runs
from hpckit.storage.checksum import short

Files = list[tuple[str, int]]  # (name, size) of each file a rank hands


def assign_writers(handed: dict[int, Files]) -> dict[str, int]:
    """The names several ranks hand, each with its writer (the lowest of them); a name that
    would leave the checkpoint, or that ranks hand with different sizes, is refused."""
    holders: dict[str, list[tuple[int, int]]] = {}
    for rank, files in sorted(handed.items()):
        for path, size in files:
            if not is_safe_relpath(path):
                raise CheckpointError(f"rank {rank} handed checkpoint file {path!r}, which would "
                                      "leave the checkpoint directory; refused.")
            holders.setdefault(path, []).append((rank, size))
    shared: dict[str, int] = {}
    for path, held in holders.items():
        if len(held) == 1:
            continue
        if len({size for _, size in held}) > 1:
            sizes = ", ".join(f"rank {r}: {s} bytes" for r, s in held)
            raise CheckpointError(collision(path, [r for r, _ in held], f"({sizes})"))
        shared[path] = held[0][0]
    return shared


def part_of(shared: dict[str, int], rank: int, files: Files) -> tuple[list[str], list[str]]:
    """The names ``rank`` writes and those it only hashes, of the ``files`` it handed."""
    writes = [name for name, _ in files if shared.get(name, rank) == rank]
    return writes, [name for name, _ in files if shared.get(name, rank) != rank]


def own_part(plan: Plan, rank: int, files: Files | None) -> Plan:
    """The plan as this rank acts on it: its own writes and hashes filled in from the names it
    handed (a plan for the caches came with every rank's)."""
    if plan.directory is None or plan.level == CACHE or not files:
        return plan
    writes, hashes = part_of(plan.shared, rank, files)
    return replace(plan, writes={rank: writes}, hashes={rank: hashes} if hashes else {})


def every_part(plan: Plan, handed: dict[int, Files]) -> Plan:
    """The plan with every rank's writes and hashes: for the caches' partner copies."""
    parts = {rank: part_of(plan.shared, rank, files) for rank, files in handed.items()}
    return replace(plan, writes={rank: w for rank, (w, _) in parts.items()},
                   hashes={rank: h for rank, (_, h) in parts.items() if h})


def digest(files: Files) -> int:
    return xxhash.xxh3_64_intdigest(repr(files).encode())


class SentFiles:
    """A rank's side: the digest of the files it last told rank 0 of, and at which report."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.sent_at: int | None = None

    def compact(self, files: Files | None, report: int) -> tuple[Files | None, int | None]:
        """What to announce at ``report``: the list where it changed, else (None, the number
        of the report that sent it)."""
        if files is None:
            return None, None
        value = digest(files)
        if value == self.last:
            return None, self.sent_at
        self.last, self.sent_at = value, report
        return files, None


class HandedFiles:
    """Rank 0's side: each rank's last list of files, and the last assignment made from them."""

    def __init__(self) -> None:
        self.files: dict[int, Files] = {}
        self.sent_at: dict[int, int] = {}  # by rank: the report that sent its list
        self.now: dict[int, Files] = {}  # every handing rank's files at the latest report
        self.count = 0  # distinct names in ``now``, as of the last assignment
        self._assigned: tuple[frozenset[int], dict[str, int]] | None = None
        self._changed = True

    def of(self, heard: Runs) -> dict[int, Files]:
        """Every handing rank's files at this report, lists sent or remembered (recorded
        even where the report then fails: the ranks remember what they sent)."""
        handed: dict[int, Files] = {}
        remembered: list[range] = []  # ranks that sent the number of an earlier report
        numbers: list[int] = []
        for a, ranks in heard:
            if a.files is not None:
                self.files.update(dict.fromkeys(ranks, a.files))
                self.sent_at.update(dict.fromkeys(ranks, a.number))
                self._changed = True
                handed.update(dict.fromkeys(ranks, a.files))
            elif a.same_files_as is not None:
                remembered.append(ranks)
                numbers.append(a.same_files_as)
        handed.update(self._remembered(list(chain.from_iterable(remembered)),
                                       list(chain.from_iterable(map(repeat, numbers,
                                                                    map(len, remembered))))))
        self.now = handed
        return handed

    def _remembered(self, ranks: list[int], numbers: list[int]) -> dict[int, Files]:
        """The lists these ranks sent at the reports they name, each rank with its own."""
        if list(map(self.sent_at.get, ranks)) != numbers:
            unknown = next(r for r, n in zip(ranks, numbers, strict=True)
                           if self.sent_at.get(r) != n)
            raise ProtocolError(f"rank {unknown} handed the files it handed last time, which "
                                "rank 0 does not know (a bug in hpckit: please report it)")
        return dict(zip(ranks, map(self.files.__getitem__, ranks), strict=True))

    def writers(self, handed: dict[int, Files]) -> dict[str, int]:
        """The assignment, made again only where a rank's list or the handing ranks changed."""
        ranks = frozenset(handed)
        if self._changed or self._assigned is None or self._assigned[0] != ranks:
            self._assigned = (ranks, assign_writers(handed))
            self.count = len({name for files in handed.values() for name, _ in files})
            self._changed = False
        return self._assigned[1]


def collision(path: str, ranks: list[int | None], detail: str) -> str:
    return (f"ranks {', '.join(map(str, ranks))} each handed checkpoint file {path!r} with "
            f"different contents {detail}; give each rank its own file name (e.g. "
            f"'model-rank={ranks[-1]}.pt') or hand the file from one rank only.")


def merge(plan: Plan, per_rank: list[Persisted]) -> list[FileRecord]:
    """One record per written name, after checking every duplicate's hash against it: the
    writer's record, or for a checkpoint written in place whichever rank hashed the name."""
    records = [r for persisted in per_rank for r in persisted.records]
    if not plan.shared:  # every name is one rank's: nothing to compare where none repeats
        by_name = {r.path: r for r in reversed(records)}
        if len(by_name) == len(records):
            return sorted(by_name.values(), key=lambda r: r.path)
    kept: dict[str, FileRecord] = {}
    for r in records:
        if plan.placement.found or plan.shared.get(r.path, r.rank) == r.rank:
            kept.setdefault(r.path, r)
    for r in records:
        first = kept[r.path]
        if r.checksum != first.checksum:
            raise CheckpointError(collision(
                r.path, [first.rank, r.rank],
                f"({short(first.checksum)} vs {short(r.checksum)})"))
    return sorted(kept.values(), key=lambda r: r.path)


def check_nodes(plan: Plan, nodes: list[NodeRecords], world_size: int) -> None:
    """On rank 0, where the node leaders wrote the records: the leaders' parts hold every
    rank's, and every name several ranks hand hashes alike on every node (else
    :func:`merge`'s CheckpointError)."""
    covered = sum(node.ranks for node in nodes)
    if covered != world_size:
        raise ProtocolError(f"the node leaders' records of {plan.directory} cover {covered} "
                            f"of {world_size} ranks (a bug in hpckit: please report it)")
    if plan.shared:
        merge(plan, [Persisted(node.shared) for node in nodes])


def attributed(plan: Plan, per_rank: list[Persisted], records: list[FileRecord]
               ) -> list[FileRecord]:
    """The records of a checkpoint whose files the ranks found in a directory they share
    (written in place, or uploaded by ``checkpoint_upload_fn``), each with the rank that wrote
    its file rather than the one that hashed it: the rank whose own save wrote it, else the
    one rank that handed the directory; ``None`` where several ranks handed it, since any of
    them may have written any file there. A rank's resume state keeps its writer."""
    if not plan.placement.found or not any(persisted.listed for persisted in per_rank):
        return records
    saved = {name: rank for rank, names in plan.later.items() for name in names}
    return [r if is_rank_state(r.path) else r._replace(rank=saved.get(r.path, plan.placed_by))
            for r in records]


def check_copies(plan: Plan, per_rank: list[Persisted]) -> None:
    """Every partner copy a rank received hashes as its writer hashed it."""
    written = {r.path: r.checksum for r in merge(plan, per_rank)}
    for rank, persisted in enumerate(per_rank):
        for name, checksum in persisted.copies:
            if written.get(name) != checksum:
                raise CheckpointError(f"rank {rank}: the partner copy of {plan.directory}/"
                                      f"{name} differs from what its writer hashed (a damaged "
                                      "transfer or local disk); the checkpoint is not committed")


def unrecorded(per_rank: list[Persisted]) -> list[str]:
    """Names some rank listed in an in-place checkpoint that no rank hashed (a rank whose view
    of a shared directory lagged): rank 0 hashes them before the commit."""
    recorded = {r.path for p in per_rank for r in p.records}
    return sorted({name for p in per_rank for name in p.listed} - recorded)
