"""Whether a checkpoint can be resumed by another number of ranks (``hpckit resume -n``).

Files that rank 0 alone wrote are read the same by any world. Torch DCP's files (a
``.metadata`` beside its ``.distcp`` shards) are resharded by ``load_state_dcp`` to the world
that loads them. Per-rank shards of any other kind belong to the ranks that wrote them.
"""

from __future__ import annotations

import posixpath

from hpckit.experiment.manifest import CheckpointRecord

DCP_METADATA = ".metadata"
DCP_SHARD = ".distcp"


def dcp_directories(record: CheckpointRecord) -> set[str]:
    """The directories of ``record`` that hold a DCP checkpoint ("" for its root)."""
    return {posixpath.dirname(f.path) for f in record.files
            if posixpath.basename(f.path) == DCP_METADATA}


def refusal(record: CheckpointRecord | None, recorded: int, ranks: int) -> str | None:
    """Why ``record`` cannot be resumed by ``ranks`` ranks instead of ``recorded``; None
    where it can."""
    if record is None or ranks == recorded:
        return None
    dcp = dcp_directories(record)
    shards = sorted({f.rank for f in record.files if f.rank != 0 and not (
        posixpath.dirname(f.path) in dcp and f.path.endswith(DCP_SHARD))})
    if not shards:
        return None
    writers = sorted({f.rank for f in record.files})
    return (f"-n {ranks} differs from the recorded world size {recorded}, but "
            f"{record.directory} holds files written by ranks {writers}: per-rank "
            f"shards need the same world size. Use -n {recorded}; or save the state with "
            "hpckit.torch.save_state_dcp, whose checkpoints load at any world size.")
