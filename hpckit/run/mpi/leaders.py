"""A gather to rank 0 through the node leaders: one contribution per node.

Rank 0 unpickles whatever every rank sends it at a step, and at thousands of ranks that was
most of its work on a report. Gathered on its node first, the node's leader sends rank 0 one
pickle for the node, which holds each distinct value once and, where they differ, which rank
sent which: in the steady state every rank of a node announces the same thing (the same
files as at an earlier report, the same mode, no failure), so rank 0 reads one value per node
and hands it to each of the node's ranks (``benchmarks/scale_model.py``). Values that differ
(file records) still cross once per rank, in the node's one pickle. The leaders do that
work in parallel, one node each. With one node there is nothing to gain, and the step is the
world's own gather (:func:`~hpckit.run.mpi.waiting.gather_to_root`).

Ranks of a node whose values are alike receive one object between them: the values gathered
are read, never changed.

Ctrl-C: every wait here watches the world for rank 0's word, as the world's gather does.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hpckit.errors import ProtocolError
from hpckit.run.mpi.group import Group
from hpckit.run.mpi.waiting import collection_paused, gather_bytes, gather_to_root, root_work

T = TypeVar("T")
C = TypeVar("C")
# A node's values: its ranks, each distinct value once, and which of them each rank sent
# (None: they all sent the first).
Contribution = tuple[tuple[int, ...], list[Any], list[int] | None]
# What a leader may do to its node's values before it sends them (``members``, ``values``):
# the same number of values back, in the same order. It must not raise.
Prepare = Callable[[tuple[int, ...], list[Any]], list[Any]]


def gather_by_nodes(group: Group, value: T, prepare: Prepare | None = None) -> list[T] | None:
    """Every rank's ``value`` to rank 0, in world rank order (None on the other ranks): to
    its node's leader, then one contribution per node to rank 0. ``prepare``: what each
    leader does to its node's values first."""
    if group.topology.num_nodes == 1:
        values = gather_to_root(group.world, value)
        return values if values is None or prepare is None else prepare(
            tuple(range(group.size)), values)
    return _through_leaders(group, value, None, prepare)


def condensed_by_nodes(group: Group, value: T, condense: Callable[[tuple[int, ...], list[T]], C]
                       ) -> list[C] | None:
    """Each node's ranks' values, condensed by its leader (``condense(members, values)``, which
    must not raise), to rank 0 in node order (None on the other ranks): rank 0 receives one
    value per node, and never the ranks' own."""
    if group.topology.num_nodes == 1:
        values = gather_to_root(group.world, value)
        return None if values is None else [condense(tuple(range(group.size)), values)]
    return _through_leaders(group, value, condense)


def _through_leaders(group: Group, value: Any, condense: Callable[..., Any] | None,
                     prepare: Prepare | None = None) -> list[Any] | None:
    data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    if group.rank != 0:
        node = gather_bytes(group.node, data, alarms=group.world)
        if group.leaders is not None:
            contribution = _contribution(group.members, _prepared(group.members, node or [],
                                                                  prepare), condense)
            gather_bytes(group.leaders, pickle.dumps(contribution, pickle.HIGHEST_PROTOCOL),
                         alarms=group.world)
        return None
    leaders = group.leaders
    if leaders is None:
        raise ProtocolError("rank 0 does not lead its node (a bug in hpckit: please report it)")
    own, contributions = root_work(group.world, lambda: (
        gather_bytes(group.node, data, alarms=group.world) or [],
        gather_bytes(leaders, b"", alarms=group.world) or []))
    if condense is not None:
        mine = _contribution(group.members, own, condense)  # the leader's work, collector on
        with collection_paused():
            return [mine, *(pickle.loads(item) for item in contributions[1:])]
    prepared = _prepared(group.members, own, prepare)
    with collection_paused():
        return placed(group.size, of_node(group.members, prepared), contributions[1:])


def placed(size: int, own: Contribution, others: Sequence[bytes | memoryview]) -> list[Any]:
    """Rank 0: every rank's value by world rank, from its own node's contribution and each
    other node's, pickled (call it with the collector paused: ``collection_paused``)."""
    values: list[Any] = [None] * size
    place(values, own)
    for item in others:
        place(values, pickle.loads(item))
    return values  # every rank is some node's


def _contribution(members: tuple[int, ...], items: Sequence[bytes | memoryview],
                  condense: Callable[..., Any] | None) -> Any:
    if condense is None:
        return of_node(members, items)
    return condense(members, [pickle.loads(item) for item in items])


def _prepared(members: tuple[int, ...], items: Sequence[bytes | memoryview],
              prepare: Prepare | None) -> Sequence[bytes | memoryview]:
    if prepare is None:
        return items
    values = prepare(members, [pickle.loads(item) for item in items])
    return [pickle.dumps(value, pickle.HIGHEST_PROTOCOL) for value in values]


def of_node(members: tuple[int, ...], items: Sequence[bytes | memoryview]) -> Contribution:
    """A leader's contribution from its node's pickled values (``items``, in ``members``'
    order): each distinct value read once."""
    distinct: dict[bytes, int] = {}
    held = [distinct.setdefault(bytes(item), len(distinct)) for item in items]
    values = [pickle.loads(item) for item in distinct]
    return members, values, None if len(values) == 1 else held


def place(placed: list[Any], contribution: Contribution) -> None:
    """Rank 0: a node's values into ``placed``, by world rank (a count that does not match
    its ranks is raised here, on rank 0, never on a leader that rank 0 waits for)."""
    members, values, held = contribution
    if held is not None and len(held) != len(members):
        raise ProtocolError(f"a node of ranks {members} gathered {len(held)} values (a bug in "
                            "hpckit: please report it)")
    if held is None:
        for rank in members:
            placed[rank] = values[0]
    else:
        for rank, index in zip(members, held, strict=True):
            placed[rank] = values[index]
