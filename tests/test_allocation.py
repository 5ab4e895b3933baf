"""A Slurm allocation's nodes for the ranks of ``python train.py``: how many the ranks fill,
which ones a step uses, and what is left when nodes are lost (pure; the three-node Slurm
runs them in tests/test_slurm_nodes.py)."""

from __future__ import annotations

import os
import time

import pytest

from hpckit.errors import LaunchError
from hpckit.launch.allocation import Allocation, srun_command, tasks_per_node
from hpckit.launch.heartbeat import STALE_S, stale

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(("asked", "given", "expected"), [
    ("4", "4(x2)", 4), (None, "2(x3),1", 2), (None, "1(x3)", 1), (None, None, 1), ("", "3", 3)])
def test_tasks_per_node_prefers_what_the_job_asked(asked, given, expected):
    assert tasks_per_node(asked, given) == expected


def test_a_step_takes_the_first_nodes_the_ranks_fill_and_spares_replace_lost_ones():
    allocation = Allocation("7", ("n1", "n2", "n3", "n4"), 2)
    assert allocation.needed(3) == 2
    assert allocation.step_nodes(3, frozenset()) == ("n1", "n2")
    assert allocation.step_nodes(3, frozenset({"n2"})) == ("n1", "n3")
    assert allocation.step_nodes(3, frozenset({"n1", "n3"})) == ("n2", "n4")
    assert allocation.step_nodes(3, frozenset({"n1", "n2", "n3"})) is None
    assert Allocation("7", ("n1",), 1).needed(5) == 1, "never more nodes than the job has"


def test_an_allocation_without_nodes_or_tasks_is_refused_with_the_job_named():
    with pytest.raises(LaunchError, match="Slurm job 7 lists no nodes"):
        Allocation("7", (), 1)
    with pytest.raises(LaunchError, match="at least 1"):
        Allocation("7", ("n1",), 0)


def test_the_step_names_its_nodes_and_overlaps_only_after_a_loss():
    allocation = Allocation("7", ("n1", "n2", "n3"), 1)
    first = srun_command(allocation, ("n1", "n2"), 2, "pmi2", "hpckit-x", ["python", "t.py"],
                         overlap=False)
    assert first[-2:] == ("python", "t.py")
    assert {"--nodes=2", "--ntasks=2", "--nodelist=n1,n2", "--jobid=7", "--mpi=pmi2",
            "--job-name=hpckit-x"} <= set(first)
    assert "--overlap" not in first
    assert "--overlap" in srun_command(allocation, ("n1", "n3"), 2, "pmi2", "hpckit-x",
                                       ["python"], overlap=True)


def test_each_task_of_a_step_asks_for_the_jobs_cpus_per_task():
    # srun of Slurm 22.05 does not inherit sbatch's --cpus-per-task (srun(1): "not
    # automatically inherited"): a step without it gives each rank one CPU where tasks are
    # bound to cores. tests/test_slurm_cpus.py shows it on a Slurm that binds them.
    bare = srun_command(Allocation("7", ("n1",), 2), ("n1",), 2, "pmi2", "s", ["p"], False)
    assert not any(word.startswith("--cpus-per-task") for word in bare)
    asked = srun_command(Allocation("7", ("n1",), 2, 4), ("n1",), 2, "pmi2", "s", ["p"], False,
                         exact=True)
    assert "--cpus-per-task=4" in asked and asked[-1] == "p"


def test_spare_nodes_that_no_restart_would_use_are_said_with_the_setting_that_allows_them():
    allocation = Allocation("7", ("n1", "n2", "n3"), 4)
    assert allocation.spares(8) == ("n3",)
    said = allocation.idle_spares(8, 0, "FailureConfig(max_failures)")
    assert said is not None and said.startswith("Slurm job 7 has 1 spare node(s) (n3), but "
                                                "FailureConfig(max_failures) is 0")
    assert allocation.idle_spares(8, 3, "FailureConfig(max_failures)") is None
    assert allocation.idle_spares(8, -1, "--max-failures") is None
    assert allocation.idle_spares(12, 0, "--max-failures") is None, "no spare: nothing to say"


def test_a_node_is_stale_once_it_beat_and_then_stopped(tmp_path):
    (tmp_path / "n1").touch()
    (tmp_path / "n2").touch()
    old = time.time() - STALE_S - 1
    os.utime(tmp_path / "n2", (old, old))
    assert stale(str(tmp_path), ("n1", "n2", "n3")) == ("n2",), "n3 has not started yet"


def test_trials_spread_over_the_nodes_share_a_node_up_to_its_tasks_and_skip_lost_ones():
    from hpckit.sweep.allocated import Places

    places = Places(Allocation("7", ("n1", "n2", "n3"), 2), 1)
    assert (places.per_node, places.capacity()) == (2, 6)
    assert [places.take() for _ in range(4)] == [("n1",), ("n2",), ("n3",), ("n1",)]
    places.lose(frozenset({"n2"}))
    assert places.capacity() == 4
    assert [places.take() for _ in range(3)] == [("n3",), None, None], "n2 is never offered"
    places.release(("n1",))
    assert places.take() == ("n1",)


def test_a_trial_larger_than_a_node_takes_whole_idle_nodes():
    from hpckit.sweep.allocated import Places

    places = Places(Allocation("7", ("n1", "n2", "n3", "n4", "n5"), 2), 3)
    assert (places.per_node, places.capacity()) == (0, 2)
    assert [places.take(), places.take(), places.take()] == [("n1", "n2"), ("n3", "n4"), None]
    places.release(("n1", "n2"))
    places.lose(frozenset({"n1"}))
    assert places.take() == ("n2", "n5"), "the idle nodes left, n1 lost"
    assert places.take() is None and places.capacity() == 2


def elastic(nodes: int, per_node: int, ranks: tuple[int, int]):
    from hpckit.launch.elastic import ElasticSteps
    from hpckit.settings import Settings

    allocation = Allocation("7", tuple(f"n{i}" for i in range(1, nodes + 1)), per_node)
    return ElasticSteps(Settings(), ranks, ["train"], allocation, grow_every_s=60.0)


def test_an_elastic_run_starts_with_what_the_nodes_hold_and_goes_on_with_fewer_after_a_loss():
    steps = elastic(2, 2, (1, 6))
    assert steps.next_ranks() == 4, "as many as two nodes of two tasks hold, under the most"
    command = steps.launch().command
    assert "--ntasks=4" in command and "--nodelist=n1,n2" in command, command
    steps.lost = frozenset({"n2"})
    assert (steps.next_ranks(), steps.fewest) == (2, 1)
    assert "--ntasks=2" in steps.launch().command and steps.ranks == 2
    assert "--overlap" in steps.launch().command, "the lost node's step may still hold CPUs"
    steps.lost = frozenset({"n1", "n2"})
    assert steps.next_ranks() == 1 and steps.allocation.step_nodes(1, steps.lost) is None
    assert "for 1 rank(s)" in steps.no_spare(), "the fewest it could go on with"


def test_an_elastic_run_does_not_grow_to_a_size_its_checkpoint_cannot_take(monkeypatch):
    from hpckit.launch import elastic as elastic_module
    from hpckit.launch import lost

    steps = elastic(2, 1, (1, 2))
    steps.lost = frozenset({"n2"})
    steps.launch()
    monkeypatch.setattr(lost, "returned", lambda nodes, job: frozenset({"n2"}))  # n2 is back
    steps.resizable = lambda ranks: f"{ranks} ranks cannot load it"
    give_up = steps.watch("/nonexistent")
    steps._grow_every_s = 0.0
    assert give_up() is False and steps.growing is False and steps.lost == {"n2"}
    assert steps.returned == frozenset(), "a node kept out is not taken for one back"
    steps.resizable = lambda ranks: None  # a newer checkpoint loads on two ranks
    assert give_up() is True and steps.growing, "asked again at the next interval"
    stopping = elastic(2, 1, (1, 2))
    stopping.lost = frozenset({"n2"})
    stopping.launch()
    stopping._grow_every_s = 0.0
    monkeypatch.setattr(elastic_module, "stop_passed_on", lambda: True)
    assert stopping.watch("/nonexistent")() is False, "a run that stops commits, not grows"
    monkeypatch.setattr(elastic_module, "stop_passed_on", lambda: False)
    grown = elastic(2, 1, (1, 2))
    grown.lost = frozenset({"n2"})
    grown.launch()
    grown._grow_every_s = 0.0
    watch = grown.watch("/nonexistent")
    assert watch() is True and grown.growing and grown.next_ranks() == 2
    assert "--overlap" in grown.launch().command, "n2 was lost: its old step may still count"
