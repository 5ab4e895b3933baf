"""A gather to rank 0 through the node leaders: one contribution per node.

Rank 0 unpickles whatever every rank sends it at a step, and at thousands of ranks that is
most of its work on a commit (every rank's file records). Unpickled one rank at a time, each
value pays for a pickle of its own (its header, each class looked up again); gathered on its
node first, the node's leader unpickles its ranks' values and sends rank 0 one pickle of
them all, which rank 0 reads at a fraction of the cost (``benchmarks/scale_model.py``). The
leaders do that work in parallel, one node each. With one node there is nothing to gain,
and the step is the world's own gather (:func:`~hpckit.run.mpi.waiting.gather_to_root`).

Ctrl-C: every wait here watches the world for rank 0's word, as the world's gather does.
"""

from __future__ import annotations

import pickle
from typing import TypeVar

from hpckit.errors import ProtocolError
from hpckit.run.mpi.group import Group
from hpckit.run.mpi.waiting import gather_bytes, gather_to_root, root_work

T = TypeVar("T")


def gather_by_nodes(group: Group, value: T) -> list[T] | None:
    """Every rank's ``value`` to rank 0, in world rank order (None on the other ranks): to
    its node's leader, then one contribution per node to rank 0."""
    if group.topology.num_nodes == 1:
        return gather_to_root(group.world, value)
    data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    if group.rank != 0:
        node = gather_bytes(group.node, data, alarms=group.world)
        if group.leaders is not None:
            values = [pickle.loads(item) for item in node or []]
            contribution = pickle.dumps((group.members, values), pickle.HIGHEST_PROTOCOL)
            gather_bytes(group.leaders, contribution, alarms=group.world)
        return None
    leaders = group.leaders
    if leaders is None:
        raise ProtocolError("rank 0 does not lead its node (a bug in hpckit: please report it)")
    own, contributions = root_work(group.world, lambda: (
        gather_bytes(group.node, data, alarms=group.world) or [],
        gather_bytes(leaders, b"", alarms=group.world) or []))
    return _in_rank_order(group, [pickle.loads(item) for item in own], contributions[1:])


def _in_rank_order(group: Group, own: list[T], contributions: list[memoryview]) -> list[T]:
    placed: list[T | None] = [None] * group.size
    for rank, value in zip(group.members, own, strict=True):
        placed[rank] = value
    for data in contributions:
        ranks, values = pickle.loads(data)
        for rank, value in zip(ranks, values, strict=True):
            placed[rank] = value
    return placed  # type: ignore[return-value]  # every rank is some node's
