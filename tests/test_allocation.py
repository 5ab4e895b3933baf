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


def test_a_node_is_stale_once_it_beat_and_then_stopped(tmp_path):
    (tmp_path / "n1").touch()
    (tmp_path / "n2").touch()
    old = time.time() - STALE_S - 1
    os.utime(tmp_path / "n2", (old, old))
    assert stale(str(tmp_path), ("n1", "n2", "n3")) == ("n2",), "n3 has not started yet"
