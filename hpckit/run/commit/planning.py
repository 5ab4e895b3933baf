"""Rank 0's decisions on each step, tested without MPI: the plan it makes from every rank's
announcement (are all ranks at the same report? which rank writes which file, told as the
names several ranks hand with their writers (``assign_writers``, from the lists it
remembers: ``HandedFiles``)? which background checkpoints has every rank finished?), the
errors when ranks disagree, and the checks of what the ranks wrote before a commit
(``merge``: one record a name, duplicates compared; ``check_nodes``, ``attributed``,
``check_copies``, ``unrecorded``)."""

from __future__ import annotations

from dataclasses import replace
from itertools import chain, repeat
from typing import Any

from hpckit.errors import CheckpointError, CommitError, ProtocolError, ReportMismatchError
from hpckit.experiment.manifest import (
    FileRecord,
    checkpoint_dirname,
    custom_dirname_problem,
    is_rank_state,
    is_safe_relpath,
)
from hpckit.run.mpi.comm import RankFailure, raise_failures
from hpckit.run.writing.plan import (
    REPORT,
    Announcement,
    Files,
    Finished,
    NodeRecords,
    Persisted,
    Placement,
    Plan,
    Runs,
    in_background,
    part_of,
    runs,
)
from hpckit.storage.copy import short


def make_plan(announcements: list[Announcement], step: int, next_index: int,
              handed_before: HandedFiles | None = None) -> Plan:
    """The plan for this report: a checkpoint directory and its writers when any rank handed
    files, else a metrics-only report; where a rank failed to prepare, a plan that says so
    (``refused``), which every rank raises once it knows what this step committed. Raises
    when ranks disagree. ``handed_before``: rank 0's memory of the files each rank handed
    last."""
    memory = handed_before or HandedFiles()
    heard = runs(announcements)
    check_agreed(announcements, Announcement, "report()", heard)
    handed = memory.of(heard)
    check_counts(heard)
    stop = next((a.stop for a, _ in heard if a.stop), None)
    failures = tuple(a.failure for a, _ in heard if a.failure)
    if failures:
        return Plan(step, stop, refused=failures)
    in_place = [rank for a, ranks in heard if a.in_place for rank in ranks]
    if announcements[0].kind != REPORT or not (handed or in_place):
        return Plan(step, stop)
    uploaded = _uploaded(heard)
    if in_place and handed:
        raise CheckpointError(
            f"rank {in_place[0]} wrote its checkpoint in place (get_checkpoint_dir()) while rank "
            f"{min(handed)} handed a directory of its own; in one report every rank either writes "
            "into get_checkpoint_dir() or hands its own directory. Write the extra files into "
            "get_checkpoint_dir() too.")
    asked = [a.asynchronous for a, _ in heard if a.hands or a.in_place]
    asynchronous = in_background(stop, all(asked))
    named = _directory_name(heard, bool(in_place) and not uploaded)
    directory = named or checkpoint_dirname(next_index)
    later = {rank: a.later for a, ranks in heard if a.later for rank in ranks}
    placement = (Placement.UPLOADED if uploaded else Placement.IN_PLACE if in_place
                 else Placement.HANDED)
    return Plan(step, stop, directory, shared=memory.writers(handed), placement=placement,
                asynchronous=asynchronous, index=next_index, later=later,
                placed_by=in_place[0] if len(in_place) == 1 else None,
                states=any(a.keeps for a, _ in heard))


def _uploaded(heard: Runs) -> bool:
    """Whether checkpoint_upload_fn uploads this checkpoint: then on every rank handing one."""
    uploading = [rank for a, ranks in heard if a.uploading for rank in ranks]
    other = [rank for a, ranks in heard if (a.hands or a.in_place) and not a.uploading
             for rank in ranks]
    if uploading and other:
        raise CheckpointError(
            f"rank(s) {_ranks(uploading)} passed checkpoint_upload_fn and rank(s) {_ranks(other)} "
            "handed a checkpoint without one; in one report pass it on every rank that hands a "
            "checkpoint (checkpoint=None on a rank with nothing to upload).")
    return bool(uploading)


def mixed_modes(announcements: list[Announcement]) -> str | None:
    """Which ranks that hand a checkpoint asked ASYNC and which did not, when they disagree (a
    rank that hands none has nothing to upload, and no say, as in Ray)."""
    handing = [(rank, a.asynchronous) for a, ranks in runs(announcements)
               if a.hands or a.in_place for rank in ranks]
    chose = {mode for _, mode in handing}
    if len(chose) < 2:
        return None
    asynchronous = _ranks([rank for rank, mode in handing if mode])
    other = _ranks([rank for rank, mode in handing if not mode])
    return f"rank(s) {asynchronous} asked for ASYNC, rank(s) {other} for SYNC or NO_UPLOAD"


def _directory_name(heard: Runs, in_place: bool) -> str | None:
    """The ``checkpoint_dir_name`` every rank that gave one agrees on, checked."""
    names = {a.dir_name for a, _ in heard if a.dir_name is not None}
    if not names:
        return None
    name = names.pop()
    if names:
        raise CheckpointError(
            f"ranks gave different checkpoint_dir_name values ({sorted([name, *names])}); give "
            "every rank the same name, or None.")
    problem = custom_dirname_problem(name)
    if problem is not None:
        raise CheckpointError(f"report(checkpoint_dir_name={name!r}): {problem}.")
    if in_place:
        raise CheckpointError(
            f"report(checkpoint_dir_name={name!r}) cannot rename a checkpoint written in place: "
            "get_checkpoint_dir() is already the directory it is committed in; drop the name, "
            "or hand a directory of your own.")
    return name


Ready = tuple[str, list[Persisted], list[NodeRecords]]


def finished_everywhere(announcements: list[Announcement], pending: list[str]
                        ) -> tuple[list[Ready], list[RankFailure]]:
    """The oldest of the ``pending`` checkpoints that every rank has finished, in order, with
    what each rank persisted (or, where the node leaders wrote its records, what each node's
    leader sends of them); and the failures of the next one, when a rank's failed."""
    # A node's alike announcements are one object (``leaders.place``): each is read once.
    done = {id(a): {f.directory: f for f in a.finished} for a in announcements}
    ready: list[Ready] = []
    for directory in pending:
        outcomes = {key: by_directory.get(directory) for key, by_directory in done.items()}
        failures = [o.failure for o in outcomes.values() if o and o.failure is not None]
        if failures:
            return ready, failures
        if any(o is None for o in outcomes.values()):
            break
        nodes = [o.node for o in outcomes.values() if o and o.node is not None]
        per_rank = [] if nodes else [_persisted(outcomes[id(a)]) for a in announcements]
        ready.append((directory, per_rank, nodes))
    return ready, []


def _persisted(finished: Finished | None) -> Persisted:
    return finished.persisted if finished and finished.persisted else Persisted([])


def raise_background_failure(directory: str, failures: list[RankFailure]) -> None:
    raise_failures(failures, f"persisting {directory} in the background", CommitError, wrap=True)


def check_agreed(heard: list[Any], kind: type, call: str,
                 alike: list[tuple[Any, range]] | None = None) -> None:
    """Every rank made the same collective call: a rank in ``report()`` while another asks
    ``should_checkpoint()`` (say, on rank 0 alone) pairs two different calls. ``alike``:
    ``heard`` as runs, where the caller has them."""
    other = [rank for value, ranks in (alike if alike is not None else runs(heard))
             if not isinstance(value, kind) for rank in ranks]
    if other:
        raise ReportMismatchError(
            f"rank(s) {_ranks(other)} made another collective call where the others called "
            f"{call}; every rank must call {call} and report() the same number of times, in "
            "the same order (ask on every rank, then act on rank 0 alone if you like).")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def check_counts(heard: Runs) -> None:
    kinds = {(a.kind, a.number) for a, _ in heard}
    if len(kinds) == 1:
        return
    lines = [f"rank {r}: called report() for the {_ordinal(a.number)} time" if a.kind == REPORT
             else f"rank {r}: returned from the training function after {a.number} report() call(s)"
             for a, ranks in heard for r in ranks]
    raise ReportMismatchError(
        "ranks disagree on the number of report() calls; every rank must call report() the same "
        "number of times (report is collective; pass checkpoint=None on ranks without files):\n  "
        + "\n  ".join(lines))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


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


def every_part(plan: Plan, handed: dict[int, Files]) -> Plan:
    """The plan with every rank's writes and hashes: for the caches' partner copies."""
    parts = {rank: part_of(plan.shared, rank, files) for rank, files in handed.items()}
    return replace(plan, writes={rank: w for rank, (w, _) in parts.items()},
                   hashes={rank: h for rank, (_, h) in parts.items() if h})


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
