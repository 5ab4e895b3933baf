"""Across nodes: several "nodes" on this machine (cluster_nodes), each with its own hostname
and node-local disk, one shared filesystem for the experiment."""

from __future__ import annotations

import json
import os
import re

import pytest
from support.cluster_nodes import nodes  # noqa: F401  (the fixture)
from conftest import HERE, STEADY, manifest, mpiexec

SHARDED = HERE / "ranks" / "sharded.py"
PROGRESS = HERE / "ranks" / "progress.py"
QUICK = {"HPCKIT_TENSORBOARD": "0"}
# MPICH's OFI network module (libfabric's tcp provider between nodes), as the start-up hook
# chooses under Slurm's PMI server: it moves a message only while both ends call MPI.
OFI = {"MPIR_CVAR_CH4_NETMOD": "ofi"}


def places(output: str) -> list[dict]:
    return sorted((json.loads(m) for m in re.findall(r"PLACE (\{.*?\}) END", output)),
                  key=lambda p: p["rank"])


def test_ranks_on_three_nodes_know_their_node_and_its_local_disk(nodes, tmp_path):
    run = nodes.mpiexec(["node-a", "node-b", "node-c"], 2, SHARDED, "--storage", str(tmp_path),
                        "--epochs", "2", "--topology", env=QUICK)
    assert [(p["rank"], p["host"], p["node_rank"], p["local_rank"], p["local_world_size"])
            for p in places(run.output)] == [
        (0, "node-a", 0, 0, 2), (1, "node-a", 0, 1, 2), (2, "node-b", 1, 0, 2),
        (3, "node-b", 1, 1, 2), (4, "node-c", 2, 0, 2), (5, "node-c", 2, 1, 2)], run.output
    assert "6 rank(s) on 3 node(s) ready in" in re.sub(r"\[\d+\] ", "", run.output)
    for host, ranks in (("node-a", (0, 1)), ("node-b", (2, 3)), ("node-c", (4, 5))):
        marks = sorted(n for n in os.listdir(nodes.disk(host)) if n.endswith("-was-here"))
        assert marks == [f"rank-{r}-was-here" for r in ranks]
    assert not list(nodes.local.iterdir()), "a node's disk leaked outside its node"
    assert manifest(tmp_path / "exp")["latest"] == "checkpoint_000001"


def test_a_job_killed_while_draining_to_storage_loses_a_node_and_resumes_elsewhere(nodes, tmp_path):
    """Asynchronous checkpoints staged on node-local disks: the whole job dies while a rank of
    the second node persists one, and that node's disk is lost. Another run is refused (the
    lock names the dead job's node); the same job, moved to another set of nodes, resumes from
    the newest committed checkpoint and ends as an uninterrupted run does."""
    args = ["--storage", str(tmp_path), "--epochs", "12", "--shard-floats", "65536",
            "--mode", "async"]
    same_run = {**QUICK, "HPCKIT_RUN_ID": "job-1"}  # as a requeued Slurm job keeps its id
    killed = nodes.mpiexec(["node-a", "node-b"], 2, SHARDED, *args, expect=None,
                           env={**same_run, "HPCKIT_FAULT": "background:2:4:all"})
    assert killed.returncode != 0 and killed.line("FINAL") is None, killed.output
    staged = list(nodes.disk("node-b").glob("hpckit-staging/*/rank-2/*/state-rank2.npy"))
    assert staged, f"rank 2 staged nothing on node-b's disk:\n{killed.output}"
    committed = manifest(tmp_path / "exp")["latest"]
    nodes.lose_disk("node-b")

    other_run = nodes.mpiexec(["node-c", "node-a"], 2, SHARDED, *args, env=QUICK, expect=None)
    assert other_run.returncode != 0, other_run.output
    assert "ExperimentLockedError" in other_run.line("RAISED") and "host node-a" in other_run.output

    resumed = nodes.mpiexec(["node-c", "node-a"], 2, SHARDED, *args, env=same_run)
    text = re.sub(r"\[\d+\] ", "", resumed.output)
    assert f"resuming experiment {tmp_path / 'exp'} from {committed}" in text, resumed.output
    reference = mpiexec(4, "--storage", str(tmp_path / "reference"), *args[2:], script=SHARDED,
                        env=QUICK)
    assert json.loads(resumed.line("FINAL")) == json.loads(reference.line("FINAL"))
    assert [a["status"] for a in manifest(tmp_path / "exp")["attempts"]][-1] == "finished"


@pytest.mark.parametrize("hosts,per_node", [(["n1", "n2", "n3"], 1), (["n1", "n2"], 2)],
                         ids=["3x1", "2x2"])
def test_a_rank_that_leaves_a_step_and_waits_outside_mpi_does_not_hang_its_peers(
        nodes, hosts, per_node, cpu_burner):
    """#64: after each kind of hpckit step, every rank waits outside MPI (on a socket) for
    every other rank to return from it, as torch's store and DDP's all-reduce make ranks
    wait after the start-up and each report. Over OFI between nodes a peer still needs the
    MPI calls of the rank that left first; without the progress that rank keeps, the
    first steps already hang here."""
    run = nodes.mpiexec(hosts, per_node, PROGRESS, "3", env=OFI, timeout=60)
    assert "PROGRESS DONE rank 0" in run.output, run.output
    rounds = re.findall(r"ROUND (\d) (\w+) OK", run.output)
    assert len(rounds) == 3 * 6, run.output


def test_torch_trainer_starts_and_trains_across_two_nodes_over_ofi(nodes, tmp_path, cpu_burner):
    """#64's hang as a user met it: the ranks' rendezvous for torch's process group right
    after an MPI step, and DDP's all-reduce right after each report, two nodes over OFI on
    a busy machine."""
    run = nodes.mpiexec(["n1", "n2"], 1, STEADY, "--torch", "--storage", str(tmp_path),
                        "--name", "ofi", "--workers", "2", "--epochs", "3",
                        env={**QUICK, **OFI, "HPCKIT_MASTER_ADDR": "127.0.0.1"}, timeout=90)
    assert "2 rank(s) on 2 node(s) ready in" in re.sub(r"\[\d+\] ", "", run.output), run.output
    assert manifest(tmp_path / "ofi")["latest"] == "checkpoint_000002", run.output
