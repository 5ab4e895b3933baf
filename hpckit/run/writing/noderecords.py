"""A checkpoint's file records merged on each node, so that rank 0's share of a commit grows
with the nodes, not the ranks.

Where a checkpoint's records go into a file of their own (more files than
``HPCKIT_INLINE_RECORDS``), handed by the ranks and written to storage_path synchronously,
each node's leader merges what its ranks wrote, writes the node's part of the records into
the checkpoint (``<checkpoint>/.hpckit-records/rank-N.json``, ``experiment.records``), and
sends rank 0 only its rank (which names the part), the part's checksum and count, the
node's bytes, and the records of the names that several ranks hand, which rank 0 compares
across nodes (:func:`checked`). Rank 0 then writes an index of the parts, one line per node.
The leaders work in parallel, inside the step's gather (``run.mpi.comm.all_reduce_by_nodes``).
"""

from __future__ import annotations

from typing import NamedTuple

from hpckit.experiment.manifest import FileRecord
from hpckit.experiment.records import PARTS_DIR, Part, part_name, render_records
from hpckit.run.writing.assignment import merge
from hpckit.run.writing.plan import Persisted, Plan
from hpckit.storage import files
from hpckit.storage.checksum import checksum_of
from hpckit.storage.location import Location


class NodeRecords(NamedTuple):
    """What rank 0 needs of one node's records of a checkpoint."""

    leader: int  # the node's first rank, which wrote the part (``records.part_name``)
    checksum: str  # the part's
    records: int  # how many it holds
    size: int  # the bytes of the files they name
    shared: list[FileRecord]  # the records of names several ranks hand, writers' and others'

    def part(self, directory: str) -> Part:
        """The part, as the index of checkpoint ``directory`` names it."""
        return Part(part_name(directory, self.leader), self.checksum, self.records)


def node_part(plan: Plan, target: Location, members: tuple[int, ...],
              per_rank: list[Persisted]) -> NodeRecords:
    """On a node's leader: its ranks' records merged and written as the node's part of the
    records of the checkpoint at ``target``."""
    directory = plan.checkpoint()[0]
    records = [r for persisted in per_rank for r in persisted.records]
    own = sorted((r for r in records if plan.shared.get(r.path, r.rank) == r.rank),
                 key=lambda r: r.path)
    data = render_records(directory, own)
    name = part_name(directory, members[0])
    if target.is_local:  # object storage has no directories (a marker object would be one more)
        files.make_dir(target.join(PARTS_DIR))
        files.fsync_dir(target.path)  # the folder's entry, made after the ranks synced theirs
    files.write_atomic(target.join(name.removeprefix(f"{directory}/")), data)
    return NodeRecords(members[0], checksum_of(data), len(own), sum(r.size for r in own),
                       [r for r in records if r.path in plan.shared])


def checked(plan: Plan, nodes: list[NodeRecords]) -> None:
    """On rank 0: every name several ranks hand hashes alike on every node (else the
    CheckpointError of :func:`~hpckit.run.writing.assignment.merge`)."""
    if plan.shared:
        merge(plan, [Persisted(node.shared) for node in nodes])
