"""Which files of a checkpoint a rank writes, told in as few bytes as the ranks need: the
ranks' side (rank 0's, which assigns the writers and merges what they wrote, is
``run.commit.planning``).

Each name a rank hands is written by that rank, unless several ranks hand the same name: the
lowest of them writes it and the others hash theirs, for comparison. So the plan carries only
the names several ranks hand, with their writers (``Plan.shared``), and every rank derives its
own part from the names it handed itself (:func:`own_part`): the plan is the same few bytes at
any rank count. (A checkpoint for the node-local caches also carries every rank's names: a
partner node receives them.)

A rank that hands the same names and sizes as the last time it handed any sends, instead of
the list, the number of the report that sent it (:class:`SentFiles`), and rank 0, which
remembers the lists (``planning.HandedFiles``), reuses the last assignment when no list changed:
in the steady state, no list of names crosses the network, rank 0 assigns nothing, and the
ranks' announcements are alike, so that each node's leader sends rank 0 one of them for all
its ranks (``run.mpi.leaders``).
"""

from __future__ import annotations

from dataclasses import replace

import xxhash

from hpckit.experiment.manifest import CACHE
from hpckit.run.writing.plan import Plan

Files = list[tuple[str, int]]  # (name, size) of each file a rank hands


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
