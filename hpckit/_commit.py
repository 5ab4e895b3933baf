"""The commit protocol behind ``report()``.

1. Every rank lists what it hands in; rank 0 gathers the lists, checks that all ranks are at
   the same report, and assigns each file name to one writer.
2. Writers persist their files (hashing as they write); ranks holding a duplicate name only
   hash theirs, so identical files are stored once and differing ones are caught.
3. Rank 0 gathers every outcome; only if all succeeded does it replace the manifest (the
   commit), append to metrics.jsonl, then delete what retention evicts.
4. Every rank learns the outcome: the new latest checkpoint, or one error raised everywhere.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from hpckit import _experiment, _faults, _retention, _stop, _storage
from hpckit._comm import RankFailure, attempt, describe, raise_failures, wait_for_all
from hpckit._log import log
from hpckit._manifest import CheckpointRecord, FileRecord, checkpoint_dirname, is_safe_relpath
from hpckit._metrics import to_json_metrics
from hpckit._session import Session
from hpckit._transfer import progress
from hpckit.checkpoint import Checkpoint
from hpckit.errors import CheckpointError, CommitError, HpckitError, ReportMismatchError

REPORT, FINISH = "report", "finish"


@dataclass(frozen=True)
class _Announcement:
    kind: str
    count: int
    files: list[tuple[str, int]] | None = None
    failure: RankFailure | None = None
    stop: str | None = None


@dataclass(frozen=True)
class _Plan:
    step: int
    stop: str | None = None
    directory: str | None = None
    writes: dict[int, list[str]] = field(default_factory=dict)
    hashes: dict[int, list[str]] = field(default_factory=dict)


def commit_report(session: Session, metrics: Any, checkpoint: Checkpoint | None) -> None:
    comm, rank = session.comm, session.comm.rank
    source: str | None = None

    def prepare() -> list[tuple[str, int]] | None:
        nonlocal source
        converted = to_json_metrics(metrics)
        if rank == 0:
            session.last_metrics = converted
        if checkpoint is None:
            return None
        source = _local_source(checkpoint, rank)
        return _list_source(source, rank)

    files, failure = attempt(rank, prepare)
    session.reports += 1
    announcements = comm.gather(
        _Announcement(REPORT, session.reports, files, failure, _stop.received()), root=0)
    plan = _decide(session, announcements)
    if plan.stop and not session.context._stop_requested:
        session.context._stop_requested = True
        if rank == 0:
            log.warning("stop requested (%s): the run stops after its next committed checkpoint",
                        plan.stop)
    directory = plan.directory
    if directory is None:
        session.next_step = plan.step + 1
        return
    started = time.perf_counter()
    records, failure = attempt(rank, lambda: _persist(session, plan, directory, source, rank))
    _faults.reached("written", rank)
    wait_for_all(comm)
    outcomes = comm.gather((records, failure), root=0)
    record: CheckpointRecord | None = None
    if rank == 0:
        record, failure = attempt(0, lambda: _commit(session, plan, directory, outcomes, started))
    wait_for_all(comm)
    record, failure = comm.bcast((record, failure), root=0)
    raise_failures([failure] if failure else [], "report()", CommitError)
    session.latest = Checkpoint._at(session.context.experiment.join(directory))
    session.next_step = plan.step + 1
    if session.mirror is not None and session.manifest is not None:
        session.mirror.after_commit(session.manifest)
    if session.context._stop_requested:
        raise _stop.StopRequested(plan.stop)


def finish(session: Session) -> None:
    """Collective end of the training function: catches ranks that reported fewer times."""
    announcements = session.comm.gather(_Announcement(FINISH, session.reports), root=0)
    _decide(session, announcements)


def _decide(session: Session, announcements: list[_Announcement] | None) -> _Plan:
    """Rank 0 makes the plan from every rank's announcement; every rank receives it."""
    outcome = (attempt(0, lambda: _plan(session, announcements or []))
               if session.comm.rank == 0 else None)
    plan, failure = session.comm.bcast(outcome, root=0)
    raise_failures([failure] if failure else [], "report()", CommitError)
    return plan


def _plan(session: Session, announcements: list[_Announcement]) -> _Plan:
    _check_counts(announcements)
    failures = [a.failure for a in announcements if a.failure]
    if failures:
        raise_failures(failures, "report()", CommitError)
    step = session.next_step
    stop = next((a.stop for a in announcements if a.stop), None)
    if announcements[0].kind == FINISH:
        return _Plan(step, stop)
    manifest, metrics = session.coordinator_state()
    handed = {rank: a.files for rank, a in enumerate(announcements) if a.files is not None}
    if not handed:
        metrics.append(step, session.last_metrics or {}, None)
        if log.isEnabledFor(logging.INFO):
            log.info("step %d: %s", step, _summary(session.last_metrics or {}))
        return _Plan(step, stop)
    writes, hashes = _assign_writers(handed)
    return _Plan(step, stop, checkpoint_dirname(manifest.next_checkpoint_index), writes, hashes)


def _check_counts(announcements: list[_Announcement]) -> None:
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


def _assign_writers(handed: dict[int, list[tuple[str, int]]]
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
            raise CheckpointError(_collision(path, [r for r, _ in held], f"({sizes})"))
        writes[held[0][0]].append(path)
        for rank, _ in held[1:]:
            hashes.setdefault(rank, []).append(path)
    return writes, hashes


def _collision(path: str, ranks: list[int], detail: str) -> str:
    return (f"ranks {', '.join(map(str, ranks))} each handed checkpoint file {path!r} with "
            f"different contents {detail}; give each rank its own file name (e.g. "
            f"'model-rank={ranks[-1]}.pt') or hand the file from one rank only.")


def _local_source(checkpoint: Any, rank: int) -> str:
    if not isinstance(checkpoint, Checkpoint):
        raise CheckpointError(
            f"rank {rank}: report(checkpoint={checkpoint!r}) must be an hpckit.Checkpoint, e.g. "
            "Checkpoint.from_directory(tmpdir).")
    if not checkpoint._location.is_local:
        raise CheckpointError(
            f"rank {rank}: report() persists local files, but {checkpoint!r} is remote; download "
            "it first (checkpoint.to_directory()) or hand a local directory.")
    checkpoint._require_dir()
    return checkpoint.path


def _list_source(source: str, rank: int) -> list[tuple[str, int]]:
    files = []
    for parent, _, names in os.walk(source, followlinks=True):
        for name in names:
            full = os.path.join(parent, name)
            rel = os.path.relpath(full, source).replace(os.sep, "/")
            if not is_safe_relpath(rel):
                raise CheckpointError(f"rank {rank}: checkpoint file name {rel!r} in {source} is "
                                      "not a plain relative path; rename it.")
            if not os.path.isfile(full):
                raise CheckpointError(f"rank {rank}: {full} is not a regular file (a broken "
                                      "link or a socket?); remove it from the checkpoint directory.")
            files.append((rel, os.path.getsize(full)))
    return sorted(files)


def _persist(session: Session, plan: _Plan, directory: str, source: str | None,
             rank: int) -> list[FileRecord]:
    writes, hashes = plan.writes.get(rank, []), plan.hashes.get(rank, [])
    if not writes and not hashes:
        return []
    assert source is not None
    target = session.context.experiment.join(directory)

    def one(rel: str) -> FileRecord:
        src = os.path.join(source, rel)
        if rel not in writes:
            size, digest = _storage.sha256_file(src)
            return FileRecord(rel, size, rank, digest)
        size, digest = _storage.persist_file(src, target.join(rel))
        _faults.reached("writing", rank)
        return FileRecord(rel, size, rank, digest)

    sizes = {rel: os.path.getsize(os.path.join(source, rel)) for rel in writes}
    with progress(sum(sizes.values()), f"rank {rank}: writing {directory}") as bar, \
            ThreadPoolExecutor(max(1, min(8, len(writes) + len(hashes)))) as pool:
        records = []
        for record in pool.map(one, writes + hashes):
            records.append(record)
            bar.update(sizes.get(record.path, 0))
    if writes and target.is_local:
        for directory in _directories(target.path, writes):
            _storage.fsync_dir(directory)
    return records


def _directories(root: str, files: list[str]) -> set[str]:
    dirs = {root, os.path.dirname(root)}
    for rel in files:
        parts = rel.split("/")[:-1]
        dirs.update(os.path.join(root, *parts[:i]) for i in range(1, len(parts) + 1))
    return dirs


def _commit(session: Session, plan: _Plan, directory: str,
            outcomes: list[tuple[list[FileRecord] | None, RankFailure | None]],
            started: float) -> CheckpointRecord:
    experiment = session.context.experiment
    manifest, metrics = session.coordinator_state()
    failures = [f for _, f in outcomes if f]
    try:
        if failures:
            raise CommitError(describe(failures, f"persisting {directory}"))
        files = _merge(plan, [records or [] for records, _ in outcomes])
    except HpckitError:
        _discard(experiment, directory)
        raise
    record = CheckpointRecord(manifest.next_checkpoint_index, directory, plan.step,
                              time.time(), session.last_metrics or {}, files)
    candidates = [*manifest.checkpoints, record]
    evicted = _retention.select_evictions(candidates, session.checkpoint_config)
    updated = replace(manifest, checkpoints=[r for r in candidates if r not in evicted],
                      next_checkpoint_index=record.index + 1, next_step=plan.step + 1)
    _faults.reached("gathered", 0)
    _experiment.write_manifest(experiment, updated)
    _faults.reached("committed", 0)
    session.manifest = updated
    log.info("step %d: %s; committed %s (%s in %d file(s)) in %.0f ms", plan.step,
             _summary(record.metrics), directory, _human(record.size), len(files),
             (time.perf_counter() - started) * 1000)
    metrics.append(plan.step, record.metrics, directory)
    _experiment.evict(experiment, evicted)
    return record


def _merge(plan: _Plan, per_rank: list[list[FileRecord]]) -> list[FileRecord]:
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
                raise CheckpointError(_collision(
                    r.path, [kept.rank, r.rank],
                    f"(sha256 {kept.sha256[:12]}... vs {r.sha256[:12]}...)"))
    return sorted(written.values(), key=lambda r: r.path)


def _discard(experiment: Any, directory: str) -> None:
    try:
        _storage.delete_dir(experiment.join(directory))
    except HpckitError as exc:
        log.warning("could not remove failed checkpoint %s (resume removes it): %s", directory, exc)


def _summary(metrics: dict[str, Any], most: int = 6) -> str:
    """The first few scalar metrics, compactly: ``loss=0.1234 acc=0.91``."""
    shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
             for k, v in metrics.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    return " ".join(shown[:most]) + (" ..." if len(shown) > most else "") or "(no metrics)"


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
