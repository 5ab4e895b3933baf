"""What rank 0 starts per report() on real ranks: MPI collectives, as many whatever the
number of ranks (hpckit.run.mpi.waiting counts them). A report with metrics only is one small
Iallreduce when no rank has more to say, and the barrier that keeps MPI progressing until every
rank has left it (#64); one with a checkpoint adds the two gathered steps, each with its
barrier."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import MPIEXEC, metrics_lines, run

pytestmark = pytest.mark.quick

COUNTED = """
import json, os, sys, tempfile
import hpckit
from hpckit import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from hpckit.run.mpi.waiting import traffic

def loop(config):
    rank = hpckit.get_context().get_world_rank()
    counted = {}
    for kind in ("metrics", "checkpoint", "metrics"):
        before = traffic()
        if kind == "metrics":
            hpckit.report({"kind": kind})
        else:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, f"shard-{rank}.bin"), "wb") as f:
                    f.write(bytes(100))
                hpckit.report({"kind": kind}, checkpoint=Checkpoint.from_directory(d))
        counted.setdefault(kind, []).append((traffic() - before).calls)
    if rank == 0:
        print("COUNTED " + json.dumps(counted), flush=True)

DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=int(sys.argv[2])),
                    run_config=RunConfig(name="counted", storage_path=sys.argv[1])).fit()
"""


def _counted(tmp_path, ranks: int) -> dict:
    script = tmp_path / "counted.py"
    script.write_text(COUNTED)
    out = run([MPIEXEC, "-n", str(ranks), sys.executable, str(script), str(tmp_path / str(ranks)),
               str(ranks)], timeout=120)
    line = next(text for text in out.output.splitlines() if "COUNTED " in text)
    return json.loads(line.split("COUNTED ", 1)[1])


def test_rank_0_starts_as_many_collectives_per_report_at_two_and_five_ranks(tmp_path):
    two, five = _counted(tmp_path, 2), _counted(tmp_path, 5)
    # metrics only: the Iallreduce that finds every rank quiet and the Ibarrier that ends the
    # step; a checkpoint: the Iallreduce, then two steps of an Igather, an Igatherv, two
    # Ibcasts and the ending Ibarrier each
    assert two == five == {"metrics": [2, 2], "checkpoint": [11]}, (two, five)
    for ranks in (2, 5):
        lines = metrics_lines(tmp_path / str(ranks) / "counted")
        assert [(m["metrics"]["kind"], m["checkpoint"]) for m in lines] == [
            ("metrics", None), ("checkpoint", "checkpoint_000000"), ("metrics", None)], lines


def test_node_leaders_bring_every_ranks_values_to_rank_0_in_rank_order(tmp_path):
    """Five ranks in simulated nodes of two (2, 2 and 1 ranks): each report's values reach
    rank 0 through the node leaders, one contribution a node, and are placed by world rank
    (a value out of place would give a rank another's files to write). Rank 0 starts two
    collectives more per gather, the leaders' Igather and Igatherv, whatever the node count."""
    script = tmp_path / "counted.py"
    script.write_text(COUNTED)
    out = run([MPIEXEC, "-n", "5", sys.executable, str(script), str(tmp_path / "nodes"), "5"],
              env={"HPCKIT_RANKS_PER_NODE": "2"}, timeout=120)
    counted = json.loads(next(text for text in out.output.splitlines()
                              if "COUNTED " in text).split("COUNTED ", 1)[1])
    assert counted == {"metrics": [2, 2], "checkpoint": [15]}, counted
    manifest = json.loads((tmp_path / "nodes" / "counted" / "manifest.json").read_text())
    files = {f["path"]: f["rank"] for f in manifest["checkpoints"][0]["files"]}
    assert files == {f"shard-{rank}.bin": rank for rank in range(5)}, files


ORDERED = """
import sys
import hpckit
from mpi4py import MPI
from hpckit.run.mpi.comm import all_reduce
from hpckit.run.mpi.group import discover

comm = MPI.COMM_WORLD.Dup()
group = discover(comm, int(sys.argv[1]))
alike = sys.argv[2] == "alike"  # every rank of a node sends the same value: sent once
value = group.topology.node_rank if alike else (comm.rank, group.topology.node_rank)
got = all_reduce(group, "gathering", lambda: value, list)
if comm.rank == 0:
    print("GATHERED", got, flush=True)
group.free()
"""


@pytest.mark.parametrize("ranks,per_node,nodes", [(5, 2, [0, 0, 1, 1, 2]), (3, 1, [0, 1, 2]),
                                                  (4, 4, [0, 0, 0, 0])])
@pytest.mark.parametrize("values", ["distinct", "alike"])
def test_a_gather_through_node_leaders_keeps_world_rank_order(tmp_path, ranks, per_node, nodes,
                                                              values):
    """Each rank's value in its place, whether a node's ranks send distinct values (each
    crosses once) or alike ones (the leader sends one for all its ranks)."""
    script = tmp_path / "ordered.py"
    script.write_text(ORDERED)
    out = run([MPIEXEC, "-n", str(ranks), sys.executable, str(script), str(per_node), values],
              timeout=60)
    expected = nodes if values == "alike" else list(enumerate(nodes))
    assert f"GATHERED {expected}" in out.output, out.output


BACKGROUND = """
import json, os, sys, tempfile
import hpckit
from hpckit import Checkpoint, CheckpointUploadMode, DataParallelTrainer, RunConfig, ScalingConfig
from hpckit.run.mpi.waiting import traffic

def loop(config):
    rank = hpckit.get_context().get_world_rank()
    for epoch in range(3):
        with tempfile.TemporaryDirectory() as d:
            for i in range(40):
                with open(os.path.join(d, f"rank{rank}-file{i:02d}.bin"), "wb") as f:
                    f.write(bytes([epoch, rank, i]))
            hpckit.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(d),
                          checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
    print(f"SENT {rank} {traffic().sent}", flush=True)

DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=5),
                    run_config=RunConfig(name="background", storage_path=sys.argv[1])).fit()
"""


def _background(tmp_path, inline: str) -> tuple[dict[int, int], dict]:
    script = tmp_path / "background.py"
    script.write_text(BACKGROUND)
    out = run([MPIEXEC, "-n", "5", sys.executable, str(script), str(tmp_path / inline)],
              env={"HPCKIT_RANKS_PER_NODE": "2", "HPCKIT_INLINE_RECORDS": inline}, timeout=120)
    sent = {int(rank): int(count) for rank, count in re.findall(r"SENT (\d+) (\d+)", out.output)}
    assert sorted(sent) == list(range(5)), out.output
    return sent, json.loads((tmp_path / inline / "background" / "manifest.json").read_text())


def test_background_checkpoints_records_reach_rank_0_from_the_node_leaders_not_the_ranks(tmp_path):
    """Five ranks in nodes of two hand 40 files each at three background (ASYNC) reports.
    Past HPCKIT_INLINE_RECORDS each node's leader writes its node's part of the records and
    sends rank 0 one summary, where every rank's records otherwise cross to rank 0 in the
    announcements that say it finished: the leaders (ranks 2 and 4) send rank 0 none of
    them, at least the bytes of their checksums fewer (41 characters, random hex), and the
    manifest's records, read back, are every rank's files, a part per node."""
    from hpckit.experiment.reading import read_manifest
    from hpckit.storage.location import resolve

    by_ranks, inline = _background(tmp_path, "100000")
    by_nodes, apart = _background(tmp_path, "0")
    assert all("records" not in c for c in inline["checkpoints"]), inline
    assert [c["records"]["parts"] for c in apart["checkpoints"]] == [3, 3, 3], apart
    for leader, ranks in ((2, 2), (4, 1)):
        checksums = ranks * 3 * 40 * len("xxh3-128:") + ranks * 3 * 40 * 32
        assert by_ranks[leader] - by_nodes[leader] >= checksums, (leader, by_nodes, by_ranks)
    read = read_manifest(resolve(str(tmp_path / "0" / "background")))
    for epoch, record in enumerate(read.checkpoints):
        assert sorted((f.path, f.rank) for f in record.files) == sorted(
            (f"rank{r}-file{i:02d}.bin", r) for r in range(5) for i in range(40)), epoch
    assert [f["path"] for f in inline["checkpoints"][2]["files"]] == \
        [f.path for f in read.checkpoints[2].files]


def test_rank_0_reads_a_gather_with_the_collector_paused_and_restored():
    """Rank 0 places each node's values by rank with the cyclic collector paused, and leaves
    it as it found it: on, or off where the program had turned it off."""
    import gc
    import pickle

    from hpckit.run.mpi.comm import of_node, placed
    from hpckit.run.mpi.waiting import collection_paused

    other = pickle.dumps(of_node((2, 3, 4), [pickle.dumps(v) for v in ("x", "y", "x")]))
    for was in (True, False):
        (gc.enable if was else gc.disable)()
        try:
            with collection_paused():
                assert not gc.isenabled()
                got = placed(5, of_node((0, 1), [pickle.dumps("a")] * 2), [other])
            assert gc.isenabled() is was and got == ["a", "a", "x", "y", "x"]
        finally:
            gc.enable()
