"""The pure parts of the commit protocol, tested without MPI: what each rank announces, the
plan rank 0 makes from every announcement (are all ranks at the same report? which rank writes
which file?), and the merge of what the ranks wrote."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpckit.errors import CheckpointError, CommitError, ReportMismatchError
from hpckit.experiment.manifest import FileRecord, checkpoint_dirname, is_safe_relpath
from hpckit.run.comm import RankFailure, raise_failures

REPORT, FINISH = "report", "finish"


@dataclass(frozen=True)
class Announcement:
    """What one rank tells rank 0 at a report (or at the end of the training function)."""

    kind: str
    count: int
    files: list[tuple[str, int]] | None = None
    failure: RankFailure | None = None
    stop: str | None = None


@dataclass(frozen=True)
class Plan:
    """Rank 0's decision for one report, sent to every rank."""

    step: int
    stop: str | None = None
    directory: str | None = None
    writes: dict[int, list[str]] = field(default_factory=dict)
    hashes: dict[int, list[str]] = field(default_factory=dict)


def make_plan(announcements: list[Announcement], step: int, next_index: int) -> Plan:
    """The plan for this report: a checkpoint directory and its writers when any rank handed
    files, else a metrics-only report. Raises when ranks disagree or one failed to prepare."""
    check_counts(announcements)
    failures = [a.failure for a in announcements if a.failure]
    if failures:
        raise_failures(failures, "report()", CommitError)
    stop = next((a.stop for a in announcements if a.stop), None)
    handed = {rank: a.files for rank, a in enumerate(announcements) if a.files is not None}
    if announcements[0].kind == FINISH or not handed:
        return Plan(step, stop)
    writes, hashes = assign_writers(handed)
    return Plan(step, stop, checkpoint_dirname(next_index), writes, hashes)


def check_counts(announcements: list[Announcement]) -> None:
    kinds = {(a.kind, a.count) for a in announcements}
    if len(kinds) == 1:
        return
    lines = [f"rank {r}: called report() for the {_ordinal(a.count)} time" if a.kind == REPORT
             else f"rank {r}: returned from the training function after {a.count} report() call(s)"
             for r, a in enumerate(announcements)]
    raise ReportMismatchError(
        "ranks disagree on the number of report() calls; every rank must call report() the same "
        "number of times (report is collective; pass checkpoint=None on ranks without files):\n  "
        + "\n  ".join(lines))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def assign_writers(handed: dict[int, list[tuple[str, int]]]
                   ) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """The lowest rank handing a name writes it; the others hash theirs for comparison."""
    holders: dict[str, list[tuple[int, int]]] = {}
    for rank, files in sorted(handed.items()):
        for path, size in files:
            if not is_safe_relpath(path):
                raise CheckpointError(f"rank {rank} handed checkpoint file {path!r}, which would "
                                      "leave the checkpoint directory; refused.")
            holders.setdefault(path, []).append((rank, size))
    writes: dict[int, list[str]] = {rank: [] for rank in handed}
    hashes: dict[int, list[str]] = {}
    for path, held in holders.items():
        if len({size for _, size in held}) > 1:
            sizes = ", ".join(f"rank {r}: {s} bytes" for r, s in held)
            raise CheckpointError(collision(path, [r for r, _ in held], f"({sizes})"))
        writes[held[0][0]].append(path)
        for rank, _ in held[1:]:
            hashes.setdefault(rank, []).append(path)
    return writes, hashes


def collision(path: str, ranks: list[int], detail: str) -> str:
    return (f"ranks {', '.join(map(str, ranks))} each handed checkpoint file {path!r} with "
            f"different contents {detail}; give each rank its own file name (e.g. "
            f"'model-rank={ranks[-1]}.pt') or hand the file from one rank only.")


def merge(plan: Plan, per_rank: list[list[FileRecord]]) -> list[FileRecord]:
    """Written records, after checking each duplicate's hash against its writer's."""
    written: dict[str, FileRecord] = {}
    for records in per_rank:
        for r in records:
            if r.path in plan.writes.get(r.rank, []):
                written[r.path] = r
    for records in per_rank:
        for r in records:
            kept = written[r.path]
            if r.sha256 != kept.sha256:
                raise CheckpointError(collision(
                    r.path, [kept.rank, r.rank],
                    f"(sha256 {kept.sha256[:12]}... vs {r.sha256[:12]}...)"))
    return sorted(written.values(), key=lambda r: r.path)
