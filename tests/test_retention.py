"""Top-K selection: pure, no MPI."""

from __future__ import annotations

import time

import pytest

from hpckit.config import CheckpointConfig
from hpckit.experiment.manifest import CheckpointRecord, checkpoint_dirname
from hpckit.experiment.retention import rank_best_first, score_of, select_evictions
from hpckit.storage.location import resolve

pytestmark = pytest.mark.quick


def records(*scores):
    return [CheckpointRecord(i, checkpoint_dirname(i), i, 0.0,
                             {} if s == "missing" else {"acc": s}, []) for i, s in enumerate(scores)]


def kept(recs, **config):
    evicted = {r.index for r in select_evictions(recs, CheckpointConfig(**config))}
    return [r.index for r in recs if r.index not in evicted]


def test_keep_all_without_num_to_keep():
    assert kept(records(1, 2, 3)) == [0, 1, 2]


def test_keep_most_recent_without_attribute():
    assert kept(records(5, 4, 3, 2), num_to_keep=2) == [2, 3]


@pytest.mark.parametrize("order,expected", [("max", [1, 3, 4]), ("min", [0, 2, 4])])
def test_keep_best_and_always_the_latest(order, expected):
    # scores 0.1 0.9 0.2 0.8 0.5: latest (4) is kept beyond the two best.
    recs = records(0.1, 0.9, 0.2, 0.8, 0.5)
    assert kept(recs, num_to_keep=2, checkpoint_score_attribute="acc",
                checkpoint_score_order=order) == sorted(expected)


@pytest.mark.parametrize("order", ["max", "min"])
def test_missing_and_nan_scores_rank_worst_under_both_orders(order):
    recs = records("missing", float("nan"), 0.5, "missing")
    ranked = rank_best_first(recs, "acc", order)
    assert ranked[0].index == 2
    assert kept(recs, num_to_keep=1, checkpoint_score_attribute="acc",
                checkpoint_score_order=order) == [2, 3]


def test_ties_keep_the_newer():
    recs = records(0.5, 0.5, 0.5, 0.1)
    assert kept(recs, num_to_keep=1, checkpoint_score_attribute="acc") == [2, 3]


def test_latest_is_kept_even_when_worst():
    assert kept(records(0.9, 0.8, 0.1), num_to_keep=1, checkpoint_score_attribute="acc") == [0, 2]


def test_nested_attribute_and_non_numbers():
    assert score_of({"val": {"acc": 0.5}}, "val/acc") == 0.5
    assert score_of({"acc": "high"}, "acc") is None
    assert score_of({"acc": True}, "acc") is None


def test_waiting_for_a_purge_never_joins_a_thread_not_yet_started(tmp_path, monkeypatch):
    """A background commit starts the purge on the commit thread while the training thread
    waits for it (CI once failed: "cannot join thread before it is started"). The thread's
    start is slowed here, so that the wait comes in between."""
    import threading

    from hpckit.experiment.manifest import CheckpointRecord
    from hpckit.experiment.experiment import Purge

    started = threading.Event()
    real_start = threading.Thread.start

    def slow_start(thread: threading.Thread) -> None:
        started.set()
        time.sleep(0.3)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    purge = Purge(resolve(str(tmp_path)))
    (tmp_path / "checkpoint_000000").mkdir()
    record = CheckpointRecord(0, "checkpoint_000000", 0, 0.0, {}, ())
    starter = threading.Thread(target=purge.start, args=([record],))
    real_start(starter)
    started.wait(5)
    purge.wait()  # raised RuntimeError when the thread was published before it started
    starter.join()
    purge.wait()
    assert not (tmp_path / "checkpoint_000000").exists()
