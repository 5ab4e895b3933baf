"""Rank 0's side of each step, tested without MPI: the plan it makes from every rank's
announcement (are all ranks at the same report? which rank writes which file? which
background checkpoints has every rank finished?), and the errors when ranks disagree."""

from __future__ import annotations

from typing import Any

from hpckit.errors import CheckpointError, CommitError, ReportMismatchError
from hpckit.experiment.manifest import checkpoint_dirname, custom_dirname_problem
from hpckit.run.mpi.comm import RankFailure, raise_failures
from hpckit.run.writing.assignment import HandedFiles
from hpckit.run.writing.plan import (
    REPORT,
    Announcement,
    Finished,
    NodeRecords,
    Persisted,
    Placement,
    Plan,
    Runs,
    in_background,
    runs,
)


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
