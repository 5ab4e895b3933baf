"""Where a sweep's trials run in a Slurm allocation that ``python sweep.py`` runs in: each
trial a job step on a place of the allocation's nodes, spread over them. A trial of no more
ranks than Slurm gives a node shares a node with others (as many as its tasks hold); a
larger trial takes whole nodes. A lost node is never offered again; the places of its
trials go with it, and the trials start again elsewhere."""

from __future__ import annotations

from collections import Counter

from hpckit.launch.allocation import Allocation


class Places:
    """The allocation's free places for trials of ``per_trial`` ranks. Pure bookkeeping:
    which nodes are lost and how many trials each node runs."""

    def __init__(self, allocation: Allocation, per_trial: int) -> None:
        self.allocation = allocation
        self.per_trial = per_trial
        self.lost: frozenset[str] = frozenset()
        self._running: Counter[str] = Counter()

    @property
    def per_node(self) -> int:
        """How many trials one node holds (0: a trial takes whole nodes)."""
        return self.allocation.tasks_per_node // self.per_trial

    @property
    def alive(self) -> tuple[str, ...]:
        return tuple(n for n in self.allocation.nodes if n not in self.lost)

    def take(self) -> tuple[str, ...] | None:
        """The nodes of the next trial, the least busy first (Slurm's order among equals);
        None when no place is free."""
        nodes: tuple[str, ...]
        if self.per_node:
            free = [n for n in self.alive if self._running[n] < self.per_node]
            if not free:
                return None
            nodes = (min(free, key=lambda n: self._running[n]),)
        else:
            idle = [n for n in self.alive if not self._running[n]]
            needed = self.allocation.needed(self.per_trial)
            if len(idle) < needed:
                return None
            nodes = tuple(idle[:needed])
        self._running.update(nodes)
        return nodes

    def release(self, nodes: tuple[str, ...]) -> None:
        """A trial on ``nodes`` ended."""
        self._running.subtract(nodes)

    def lose(self, nodes: frozenset[str]) -> None:
        self.lost |= nodes

    def capacity(self) -> int:
        """How many trials the nodes not lost hold at once."""
        if self.per_node:
            return len(self.alive) * self.per_node
        return len(self.alive) // self.allocation.needed(self.per_trial)
