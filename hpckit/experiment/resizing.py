"""Whether a checkpoint can be resumed by another number of ranks (``hpckit resume -n``).

Files that rank 0 alone wrote are read the same by any world. Torch DCP's files (a
``.metadata`` beside its ``.distcp`` shards) are resharded by ``load_state_dcp`` to the world
that loads them. The ranks' resume states are left behind at another world size (the
ranks' random streams and loader positions start afresh). Per-rank shards of any other kind
belong to the ranks that wrote them, and a file written in place by one of several ranks
(its record's rank ``None``) may be one.
"""

from __future__ import annotations

import posixpath

from hpckit.experiment.manifest import CheckpointRecord, FileRecord, is_rank_state

DCP_METADATA = ".metadata"
DCP_SHARD = ".distcp"


def dcp_directories(record: CheckpointRecord) -> set[str]:
    """The directories of ``record`` that hold a DCP checkpoint ("" for its root)."""
    return {posixpath.dirname(f.path) for f in record.files
            if posixpath.basename(f.path) == DCP_METADATA}


def _dcp_file(f: FileRecord, dcp: set[str]) -> bool:
    name = posixpath.basename(f.path)
    return posixpath.dirname(f.path) in dcp and (name == DCP_METADATA or name.endswith(DCP_SHARD))


def refusal(record: CheckpointRecord | None, recorded: int, ranks: int,
            asked: str | None = None, keep: str | None = None) -> str | None:
    """Why ``record`` cannot be resumed by ``ranks`` ranks instead of ``recorded``; None
    where it can. ``asked``: what asked for ``ranks`` (``hpckit resume -n``'s flag by
    default); ``keep``: how to keep the recorded world instead."""
    if record is None or ranks == recorded:
        return None
    dcp = dcp_directories(record)
    others = [f for f in record.files if not _dcp_file(f, dcp) and not is_rank_state(f.path)]
    unknown = sorted(f.path for f in others if f.rank is None)
    shards = sorted({f.rank for f in others if f.rank is not None and f.rank != 0})
    if not shards and not unknown:
        return None
    differs = f"{asked or f'-n {ranks}'} differs from the recorded world size {recorded}, but "
    fix = (f"{keep or f'Use -n {recorded}'}; or save the state with "
           "hpckit.torch.save_state_dcp, whose checkpoints load at any world size.")
    if shards:
        writers = sorted({f.rank for f in record.files if f.rank is not None})
        more = f" (and {len(unknown)} whose writer is not known)" if unknown else ""
        return (f"{differs}{record.directory} holds files written by ranks {writers}{more}: "
                f"per-rank shards need the same world size. {fix}")
    named = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    return (f"{differs}{record.directory} holds files written in place by ranks that all handed "
            f"get_checkpoint_dir() ({named}): hpckit cannot tell which rank wrote them, so they "
            f"may be per-rank shards. {fix} Where rank 0 alone writes a checkpoint in place, "
            "report checkpoint=None on the other ranks, and it resumes at any size.")
