"""What rank 0 starts per report() on real ranks: MPI collectives, as many whatever the
number of ranks (hpckit.run.mpi.waiting counts them). A report with metrics only is one small
Iallreduce when no rank has more to say; one with a checkpoint adds the two gathered steps."""

from __future__ import annotations

import json
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
    # metrics only: the Iallreduce that finds every rank quiet; a checkpoint: that one, then
    # two steps of an Igather, an Igatherv and two Ibcasts each
    assert two == five == {"metrics": [1, 1], "checkpoint": [9]}, (two, five)
    for ranks in (2, 5):
        lines = metrics_lines(tmp_path / str(ranks) / "counted")
        assert [(m["metrics"]["kind"], m["checkpoint"]) for m in lines] == [
            ("metrics", None), ("checkpoint", "checkpoint_000000"), ("metrics", None)], lines
