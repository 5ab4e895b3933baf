"""The pure parts of the commit protocol, without MPI: planning a report from every rank's
announcement, assigning writers, merging what the ranks wrote, and the retry policy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpckit.errors import CheckpointError, ProtocolError, ReportMismatchError
from hpckit.experiment.manifest import FileRecord
from hpckit.run.ending.retry import RetryPolicy
from hpckit.run.mpi.comm import RankFailure
from hpckit.run.commit.planning import HandedFiles, every_part, merge
from hpckit.run.writing.plan import (
    REPORT,
    RETURNED,
    Announcement,
    Persisted,
    Plan,
    SentFiles,
    in_background,
    own_part,
)
from hpckit.run.commit.planning import make_plan, mixed_modes

pytestmark = pytest.mark.quick


def test_a_report_with_files_gets_a_directory_and_one_writer_per_name():
    plan = make_plan([Announcement(REPORT, 3, [("a.pt", 4), ("shared.json", 2)]),
                      Announcement(REPORT, 3, None),
                      Announcement(REPORT, 3, [("b.pt", 4), ("shared.json", 2)], stop="SIGUSR2")],
                     step=7, next_index=12)
    assert plan.directory == "checkpoint_000012" and plan.step == 7 and plan.stop == "SIGUSR2"
    assert plan.shared == {"shared.json": 0}, "only names several ranks hand travel"
    files = {0: [("a.pt", 4), ("shared.json", 2)], 2: [("b.pt", 4), ("shared.json", 2)]}
    assert own_part(plan, 0, files[0]).writes == {0: ["a.pt", "shared.json"]}
    assert own_part(plan, 2, files[2]).writes == {2: ["b.pt"]}
    assert own_part(plan, 2, files[2]).hashes == {2: ["shared.json"]}
    assert own_part(plan, 1, None) == plan


def test_a_report_without_files_or_the_return_plans_no_checkpoint():
    assert make_plan([Announcement(REPORT, 1), Announcement(REPORT, 1)], 4, 0) == Plan(4)
    assert make_plan([Announcement(RETURNED, 2)] * 3, 4, 0).directory is None


def test_ranks_at_different_reports_are_named():
    with pytest.raises(ReportMismatchError) as info:
        make_plan([Announcement(REPORT, 2), Announcement(RETURNED, 1), Announcement(REPORT, 2)], 0, 0)
    text = str(info.value)
    assert "rank 0: called report() for the 2nd time" in text
    assert "rank 1: returned from the training function after 1 report() call(s)" in text


def test_a_rank_that_failed_to_prepare_makes_a_plan_that_refuses_the_report():
    """#65: the plan says so, and writes nothing; every rank raises it once it has learnt what
    the step committed of the checkpoints persisted before."""
    failure = RankFailure.capture(1, CheckpointError("rank 1: no such directory"))
    plan = make_plan([Announcement(REPORT, 1, [("a.pt", 1)]),
                      Announcement(REPORT, 1, failure=failure)], 0, 0)
    assert plan.refused == (failure,) and plan.directory is None, plan


@pytest.mark.parametrize("files,fragment", [
    ({0: [("../x", 1)]}, "would leave the checkpoint directory"),
    ({0: [("m.pt", 1)], 1: [("m.pt", 2)]}, "rank 0: 1 bytes, rank 1: 2 bytes"),
])
def test_bad_hand_ins_are_refused_before_anything_is_written(files, fragment):
    announcements = [Announcement(REPORT, 1, f) for f in files.values()]
    with pytest.raises(CheckpointError, match=fragment.replace("(", r"\(")):
        make_plan(announcements, 0, 0)


def test_merge_keeps_the_writers_records_and_catches_differing_duplicates():
    plan = Plan(0, None, "checkpoint_000000", shared={"s": 0})
    same = [[FileRecord("a", 1, 0, "x"), FileRecord("s", 1, 0, "h")],
            [FileRecord("b", 1, 1, "y"), FileRecord("s", 1, 1, "h")]]
    assert [(r.path, r.rank) for r in merge(plan, [Persisted(r) for r in same])] == [("a", 0), ("b", 1), ("s", 0)]
    differing = [same[0], [FileRecord("b", 1, 1, "y"), FileRecord("s", 1, 1, "other")]]
    with pytest.raises(CheckpointError, match="ranks 0, 1 each handed checkpoint file 's'"):
        merge(plan, [Persisted(r) for r in differing])


@pytest.mark.parametrize("limit,attempts,allowed", [
    (0, [0, 1], [False, False]),
    (2, [0, 1, 2, 3], [True, True, False, False]),
    (-1, [0, 1, 50, 10_000], [True, True, True, True]),
])
def test_the_retry_policy(limit, attempts, allowed):
    policy = RetryPolicy(limit)
    assert [policy.allows(a) for a in attempts] == allowed
    assert policy.describe(1) == f"restart 1 of {'unlimited' if limit == -1 else limit}"


def _handing(asynchronous: list[bool | None]) -> list[Announcement]:
    """One announcement per rank: None hands no checkpoint (and so asks for no mode)."""
    return [Announcement(REPORT, 1) if a is None else
            Announcement(REPORT, 1, [(f"m{rank}.pt", 8)], asynchronous=a)
            for rank, a in enumerate(asynchronous)]


def test_ranks_without_a_checkpoint_do_not_make_a_report_synchronous():
    """Ray takes the mode per worker: rank 0 handing ASYNC while the others report metrics
    only (checkpoint=None, hence no mode) is an asynchronous report."""
    announcements = _handing([True, None, None])
    assert make_plan(announcements, 0, 0).asynchronous
    assert mixed_modes(announcements) is None


def test_ranks_that_hand_checkpoints_in_different_modes_are_named():
    announcements = _handing([True, False, None, True])
    assert not make_plan(announcements, 0, 0).asynchronous
    assert mixed_modes(announcements) == \
        "rank(s) 0, 3 asked for ASYNC, rank(s) 1 for SYNC or NO_UPLOAD"


def test_a_stop_makes_every_level_synchronous():
    stopped = [a._replace(stop="SIGUSR2") for a in _handing([True, True])]
    assert not make_plan(stopped, 0, 0).asynchronous
    assert not in_background("SIGUSR2", True) and in_background(None, True)


def test_the_same_files_again_travel_as_a_report_number_and_reuse_the_assignment(monkeypatch):
    """In the steady state no list of names crosses the network and rank 0 assigns nothing:
    a rank that hands the same names and sizes sends the number of the report that sent them,
    and rank 0 reuses the last assignment; a rank whose list changed sends it, and rank 0
    assigns again. The ranks that hand their lists at the same report then announce alike,
    which is what lets a node's leader send one announcement for all its ranks."""
    from hpckit.run.commit import planning

    lists = [[("m0.pt", 8), ("cfg.json", 2)], [("m1.pt", 8), ("cfg.json", 2)], None]
    sent, memory = [SentFiles() for _ in lists], HandedFiles()
    made = []
    monkeypatch.setattr(planning, "assign_writers",
                        lambda handed: made.append(handed) or {"cfg.json": 0})

    announced = []

    def report(count: int, lists) -> Plan:
        compact = [s.compact(files, count) for s, files in zip(sent, lists)]
        announced.append([Announcement(REPORT, count, files, same_files_as=same)
                          for files, same in compact])
        return make_plan(announced[-1], count, count, memory)

    first = report(1, lists)
    assert report(2, lists) == replace(first, step=2, index=2, directory="checkpoint_000002")
    assert [a.files for a in announced[-1]] == [None, None, None], "sent once"
    assert [a.same_files_as for a in announced[-1]] == [1, 1, None]
    assert announced[-1][0] == announced[-1][1], "handing ranks announce alike"
    assert len(made) == 1
    assert own_part(report(3, lists), 1, lists[1]).hashes == {1: ["cfg.json"]}
    changed = [lists[0], [("m1.pt", 9), ("cfg.json", 2)], None]
    report(4, changed)
    assert len(made) == 2 and made[-1][1] == [("m1.pt", 9), ("cfg.json", 2)]
    report(5, [lists[0], None, None])
    assert len(made) == 3, "a rank that stopped handing changes the assignment"
    assert every_part(first, memory.now).writes == {0: ["m0.pt", "cfg.json"]}


def test_a_report_number_rank_0_does_not_know_is_a_protocol_error():
    from hpckit.errors import ProtocolError

    with pytest.raises(ProtocolError, match="rank 1 handed the files it handed last time"):
        make_plan([Announcement(REPORT, 1, [("a", 1)]), Announcement(REPORT, 1, same_files_as=7)],
                  0, 0, HandedFiles())


def test_rank_0_walks_runs_of_alike_announcements_and_plans_as_rank_by_rank():
    """A node's alike announcements arrive as one object: rank 0 reads each run once, with
    its ranks, and the plan is the one every rank's own announcement would give."""
    from hpckit.run.writing.plan import runs

    steady = Announcement(REPORT, 2, same_files_as=1, later=("late.pt",))
    other = Announcement(REPORT, 2, same_files_as=1)
    assert runs([steady, steady, other, steady]) == [
        (steady, range(0, 2)), (other, range(2, 3)), (steady, range(3, 4))]
    lists = [[(f"m{r}.pt", 1), ("cfg.json", 2)] for r in range(4)]
    memory = HandedFiles()
    make_plan([Announcement(REPORT, 1, files) for files in lists], 0, 0, memory)
    plan = make_plan([steady, steady, other, steady], 1, 1, memory)
    assert memory.now == dict(enumerate(lists)) and plan.shared == {"cfg.json": 0}
    assert plan.later == {0: ("late.pt",), 1: ("late.pt",), 3: ("late.pt",)}
    with pytest.raises(ProtocolError, match="rank 2 handed the files it handed last time"):
        make_plan([steady, steady, steady._replace(same_files_as=0), steady], 2, 2, memory)


def test_a_rank_in_another_collective_call_is_named_before_any_announcement_is_read():
    """Rank 0 in report() while rank 1 asks should_checkpoint(): the mismatch is named, where
    reading rank 1's value as an announcement failed with an AttributeError."""
    with pytest.raises(ReportMismatchError, match=r"rank\(s\) 1 made another collective call"):
        make_plan([Announcement(REPORT, 1, [("a", 1)]), True, Announcement(REPORT, 1)], 0, 0,
                  HandedFiles())


def test_a_plan_crosses_with_only_the_fields_that_differ_from_their_defaults():
    """Rank 0 sends the plan to every rank at every step: it pickles only what is not a
    default, reads back equal, and each plan read back has dicts of its own."""
    import pickle

    from hpckit.run.writing.plan import Placement

    plans = [Plan(3), Plan(7, directory="checkpoint_000003", index=3, shared={"cfg.json": 0}),
             Plan(9, stop="SIGUSR2", placement=Placement.IN_PLACE, by_nodes=True,
                  later={1: ("state.pt",)})]
    for plan in plans:
        assert pickle.loads(pickle.dumps(plan, pickle.HIGHEST_PROTOCOL)) == plan
    one, two = (pickle.loads(pickle.dumps(plans[0])) for _ in range(2))
    assert one.writes is not two.writes
    assert len(pickle.dumps(plans[1], pickle.HIGHEST_PROTOCOL)) < 150
