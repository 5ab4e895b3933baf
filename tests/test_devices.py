"""Each rank's GPUs and CPU threads, on simulated nodes: as Ray gives each worker its own
CUDA_VISIBLE_DEVICES, and the CPUs Slurm gave each task."""

from __future__ import annotations

import pytest

from hpckit import settings
from hpckit.errors import LaunchError
from hpckit.integrations.torch.distributed import cpu_threads, share_gpus
from hpckit.run.validation.child import environment

pytestmark = pytest.mark.quick

UUIDS = [f"GPU-{i}aa1b2c3-0000-4000-8000-00000000000{i}" for i in range(4)]
MIGS = [f"MIG-{i}bb1b2c3-0000-4000-8000-00000000000{i}" for i in range(2)]


def node(ranks: int, gpus: int, per_rank: float = 1, visible: str | None = None) -> list[str]:
    """What every local rank of a node is given, as the CUDA_VISIBLE_DEVICES it sets."""
    seen = [visible] * ranks
    return [share_gpus(r, ranks, per_rank, gpus, seen, "gpu07").visible for r in range(ranks)]


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_each_rank_of_a_node_sees_only_its_own_gpu(gpus):
    assert node(gpus, gpus) == [str(i) for i in range(gpus)]


def test_a_rank_with_several_gpus_sees_all_of_them_and_no_other_ranks():
    assert node(2, 4, per_rank=2) == ["0,1", "2,3"]
    assert node(1, 8, per_rank=8) == [",".join(map(str, range(8)))]
    assert node(1, 8) == ["0"]  # one rank asking for one GPU is given one, as in Ray


def test_ranks_given_a_fraction_share_a_device():
    assert node(4, 2, per_rank=0.5) == ["0", "0", "1", "1"]
    assert node(3, 1, per_rank=0.25) == ["0", "0", "0"]


def test_the_site_s_device_list_is_split_as_it_names_them():
    assert node(4, 4, visible=",".join(UUIDS)) == UUIDS
    assert node(2, 2, visible=",".join(MIGS)) == MIGS
    assert node(2, 8, visible="4,5,6,7", per_rank=2) == ["4,5", "6,7"]


def test_a_rank_the_launcher_bound_keeps_its_own_devices():
    # srun --gpus-per-task=1 or --gpu-bind: each task already sees one device, as index 0
    # or by the node's index; either way it keeps it.
    for bound in (["0", "1", "2", "3"], ["1", "0", "3", "2"], UUIDS):
        shares = [share_gpus(r, len(bound), 1, 1, bound, "gpu07") for r in range(len(bound))]
        assert [s.visible for s in shares] == [b.split(",")[0] for b in bound]
        assert {s.first for s in shares} == {0}
    bound_two = ["0,1", "2,3"]
    assert [share_gpus(r, 2, 2, 2, bound_two, "n").visible for r in range(2)] == bound_two


def test_where_cuda_started_a_rank_uses_its_devices_among_all_it_sees():
    shares = [share_gpus(r, 4, 2, 8, [None] * 4, "n") for r in range(4)]
    assert [s.first for s in shares] == [0, 2, 4, 6]


def test_too_few_gpus_on_a_node_names_the_node_and_what_would_fit():
    with pytest.raises(LaunchError, match=r"node gpu07 has 2 visible GPU\(s\) but its 4 rank\(s\)"
                       r" need 4 .*CUDA_VISIBLE_DEVICES unset.*--ntasks-per-node=2"):
        node(4, 2)
    with pytest.raises(LaunchError, match=r"has 1 visible GPU.*CUDA_VISIBLE_DEVICES '3'"):
        node(2, 1, visible="3")


def masks(*cpu_lists: range) -> list[frozenset[int]]:
    return [frozenset(cpus) for cpus in cpu_lists]


def test_a_rank_bound_to_its_own_cpus_uses_them_all():
    # srun --cpus-per-task=4 with task/affinity: four tasks, four CPUs each, on 16
    bound = masks(range(0, 4), range(4, 8), range(8, 12), range(12, 16))
    assert [cpu_threads(None, bound, r, 4) for r in range(4)] == [4, 4, 4, 4]
    assert [cpu_threads(None, bound, r, None) for r in range(4)] == [4, 4, 4, 4]


def test_ranks_that_share_the_node_s_cpus_divide_them():
    shared = masks(*[range(16)] * 4)
    assert [cpu_threads(None, shared, r, None) for r in range(4)] == [4, 4, 4, 4]
    assert cpu_threads(None, masks(*[range(2)] * 4), 0, None) == 1


def test_slurm_s_cpus_per_task_caps_ranks_it_did_not_bind():
    # task/none: every task sees the whole node, Slurm gave each two
    assert [cpu_threads(None, masks(*[range(16)] * 2), r, 2) for r in range(2)] == [2, 2]


def test_ranks_bound_per_socket_share_their_socket():
    sockets = masks(range(8), range(8), range(8, 16), range(8, 16))
    assert [cpu_threads(None, sockets, r, None) for r in range(4)] == [4, 4, 4, 4]


def test_threads_asked_for_are_given():
    assert cpu_threads(3, masks(*[range(16)] * 4), 0, None) == 3


@pytest.mark.parametrize("started", [None, "0,1,2,3"])
def test_a_validation_process_gets_the_devices_the_rank_started_with(monkeypatch, started):
    if started is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", started)
    settings.refresh()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")  # the rank narrowed to its own
    try:
        assert environment(1).get("CUDA_VISIBLE_DEVICES") == started
    finally:
        monkeypatch.undo()
        settings.refresh()


def test_a_validation_process_keeps_an_empty_device_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    settings.refresh()
    try:
        assert environment(1)["CUDA_VISIBLE_DEVICES"] == ""
    finally:
        monkeypatch.undo()
        settings.refresh()
